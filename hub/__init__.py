"""Publishing to the Hugging Face Hub: export a trained model as a self-contained remote-code
folder with its model card (``export_model``), as a native transformers class
(``export_native``) or as a CTranslate2 model (``export_ct2``), and upload it (``push_to_hub``)."""

from .export import ExportError, export_model
from .export_ct2 import CT2ExportRefused, export_ct2
from .export_native import NativeExportRefused, export_native
from .model_card import ModelCardError, render_model_card
from .push import PushError, PushResult, push_to_hub

__all__ = [
    "CT2ExportRefused",
    "ExportError",
    "NativeExportRefused",
    "export_ct2",
    "export_native",
    "ModelCardError",
    "PushError",
    "PushResult",
    "export_model",
    "push_to_hub",
    "render_model_card",
]
