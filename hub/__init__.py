"""Publishing to the Hugging Face Hub: export a trained model as a self-contained remote-code
folder with its model card (``export_model``), as a native transformers class
(``export_native``) or as a CTranslate2 model (``export_ct2``), and upload it (``push_to_hub``).

The names load on first use (PEP 562): ``attention-seq2seq --help`` reaches ``hub.push`` through
this package without importing torch, which the native and CTranslate2 exports need."""

from attention_seq2seq.common.errors import lazy_exports

_EXPORTS = {
    "CT2ExportRefused": ".export_ct2",
    "ExportError": ".export",
    "NativeExportRefused": ".export_native",
    "export_ct2": ".export_ct2",
    "export_native": ".export_native",
    "ModelCardError": ".model_card",
    "PushError": ".push",
    "PushResult": ".push",
    "export_model": ".export",
    "push_to_hub": ".push",
    "render_model_card": ".model_card",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
