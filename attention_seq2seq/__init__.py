"""attention_seq2seq: the classic attention models for sequence-to-sequence learning as
transformers v5 models.

Importing the package registers both model families with transformers' Auto classes
(``AutoConfig``, ``AutoModel``, ``AutoModelForSeq2SeqLM``), so a folder written by
``save_pretrained`` loads with ``AutoModelForSeq2SeqLM.from_pretrained`` while the package is
installed. Hub exports (``attention-seq2seq export``) carry their own flattened code instead.
"""

__version__ = "0.1.0"

# TEMPORARY (integration in progress): tolerate a model family that is not written yet.
try:
    from .configuration.configuration_rnn_seq2seq import RNNSeq2SeqConfig
    from .modeling.modeling_rnn_seq2seq import (
        RNNSeq2SeqForConditionalGeneration,
        RNNSeq2SeqModel,
        RNNSeq2SeqPreTrainedModel,
    )
except ImportError:  # pragma: no cover
    RNNSeq2SeqConfig = RNNSeq2SeqModel = RNNSeq2SeqForConditionalGeneration = RNNSeq2SeqPreTrainedModel = None
try:
    from .configuration.configuration_transformer_seq2seq import TransformerSeq2SeqConfig
    from .modeling.modeling_transformer_seq2seq import (
        TransformerSeq2SeqForConditionalGeneration,
        TransformerSeq2SeqModel,
        TransformerSeq2SeqPreTrainedModel,
    )
except ImportError:  # pragma: no cover
    TransformerSeq2SeqConfig = TransformerSeq2SeqModel = None
    TransformerSeq2SeqForConditionalGeneration = TransformerSeq2SeqPreTrainedModel = None


def _register_auto_classes() -> None:
    """Register both families with the Auto classes (idempotent: safe on re-import)."""
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    for config_cls, base_cls, lm_cls in (
        (RNNSeq2SeqConfig, RNNSeq2SeqModel, RNNSeq2SeqForConditionalGeneration),
        (TransformerSeq2SeqConfig, TransformerSeq2SeqModel, TransformerSeq2SeqForConditionalGeneration),
    ):
        if config_cls is None:
            continue
        AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
        AutoModel.register(config_cls, base_cls, exist_ok=True)
        AutoModelForSeq2SeqLM.register(config_cls, lm_cls, exist_ok=True)


_register_auto_classes()

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
