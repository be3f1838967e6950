"""attention_seq2seq: the classic attention models for sequence-to-sequence learning as
transformers v5 models.

Importing the package registers both model families with transformers' Auto classes
(``AutoConfig``, ``AutoModel``, ``AutoModelForSeq2SeqLM``), so a folder written by
``save_pretrained`` loads with ``AutoModelForSeq2SeqLM.from_pretrained`` while the package is
installed. Hub exports (``attention-seq2seq export``) carry their own flattened code instead.
"""

__version__ = "0.1.0"

from .configuration.configuration_rnn_seq2seq import RNNSeq2SeqConfig
from .configuration.configuration_transformer_seq2seq import TransformerSeq2SeqConfig
from .modeling.modeling_rnn_seq2seq import (
    RNNSeq2SeqForConditionalGeneration,
    RNNSeq2SeqModel,
    RNNSeq2SeqPreTrainedModel,
)
from .modeling.modeling_transformer_seq2seq import (
    TransformerSeq2SeqForConditionalGeneration,
    TransformerSeq2SeqModel,
    TransformerSeq2SeqPreTrainedModel,
)


def _register_auto_classes() -> None:
    """Register both families with the Auto classes (idempotent: safe on re-import)."""
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    for config_cls, base_cls, lm_cls in (
        (RNNSeq2SeqConfig, RNNSeq2SeqModel, RNNSeq2SeqForConditionalGeneration),
        (TransformerSeq2SeqConfig, TransformerSeq2SeqModel, TransformerSeq2SeqForConditionalGeneration),
    ):
        AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, base_cls, exist_ok=True)
        AutoModelForSeq2SeqLM.register(config_cls, lm_cls, exist_ok=True)


_register_auto_classes()


def _write_remote_code(model, save_directory) -> None:
    from .hub.export import write_remote_code  # imported when first needed

    write_remote_code(model, save_directory)


def _install_remote_code_writer() -> None:
    """`register_for_auto_class()` + `save_pretrained()` on the installed package's models writes
    the flattened remote code (see modeling/saving.py)."""
    from .modeling import saving

    saving.REMOTE_CODE_WRITER = _write_remote_code


_install_remote_code_writer()

__all__ = [
    "RNNSeq2SeqConfig",
    "RNNSeq2SeqModel",
    "RNNSeq2SeqPreTrainedModel",
    "RNNSeq2SeqForConditionalGeneration",
    "TransformerSeq2SeqConfig",
    "TransformerSeq2SeqModel",
    "TransformerSeq2SeqPreTrainedModel",
    "TransformerSeq2SeqForConditionalGeneration",
]
