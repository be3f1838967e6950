"""The model families of this package, in one table.

Every place that needs to know which families exist reads :data:`FAMILIES`: the package root
(its lazy exports and the Auto-class registration), the trainer (``model_family`` of a recipe),
the Hub export (the flat files to ship and ``auto_map``) and the model card (its template).
A new family is one :class:`ModelFamily` entry here, plus its configuration and modeling files.

Importing this module is cheap: the classes are imported on first use
(:meth:`ModelFamily.config_cls`, :meth:`ModelFamily.lm_cls`, ...), never at import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

_PACKAGE = "attention_seq2seq"


@dataclass(frozen=True)
class ModelFamily:
    """Where a family's code lives and what it is called.

    Attributes:
        name: the short name recipes use (``model_family: rnn``).
        model_type: ``config.model_type`` (``config.json``, the Auto classes).
        config_module, modeling_module: file names (without ``.py``) in ``configuration/`` and
            ``modeling/``; an export ships them flat under the same names.
        config_class, base_model_class, pretrained_model_class, lm_class: the classes' names.
        card_template: the model card's template in ``hub_cards/``.
    """

    name: str
    model_type: str
    config_module: str
    config_class: str
    modeling_module: str
    base_model_class: str
    pretrained_model_class: str
    lm_class: str
    card_template: str

    def _load(self, folder: str, module: str, attribute: str):
        return getattr(importlib.import_module(f"{_PACKAGE}.{folder}.{module}"), attribute)

    def config_cls(self):
        """The configuration class (imports ``configuration/<config_module>.py``)."""
        return self._load("configuration", self.config_module, self.config_class)

    def base_model_cls(self):
        """The bare encoder-decoder class (imports ``modeling/<modeling_module>.py`` and torch)."""
        return self._load("modeling", self.modeling_module, self.base_model_class)

    def lm_cls(self):
        """The ``...ForConditionalGeneration`` class (imports ``modeling/<modeling_module>.py`` and torch)."""
        return self._load("modeling", self.modeling_module, self.lm_class)

    def exports(self) -> dict[str, str]:
        """Public class name -> the package's submodule that defines it (for lazy attribute access)."""
        return {
            self.config_class: f".configuration.{self.config_module}",
            self.base_model_class: f".modeling.{self.modeling_module}",
            self.pretrained_model_class: f".modeling.{self.modeling_module}",
            self.lm_class: f".modeling.{self.modeling_module}",
        }


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily(
        name="rnn",
        model_type="rnn_seq2seq",
        config_module="configuration_rnn_seq2seq",
        config_class="RNNSeq2SeqConfig",
        modeling_module="modeling_rnn_seq2seq",
        base_model_class="RNNSeq2SeqModel",
        pretrained_model_class="RNNSeq2SeqPreTrainedModel",
        lm_class="RNNSeq2SeqForConditionalGeneration",
        card_template="rnn_seq2seq.md",
    ),
    ModelFamily(
        name="transformer",
        model_type="transformer_seq2seq",
        config_module="configuration_transformer_seq2seq",
        config_class="TransformerSeq2SeqConfig",
        modeling_module="modeling_transformer_seq2seq",
        base_model_class="TransformerSeq2SeqModel",
        pretrained_model_class="TransformerSeq2SeqPreTrainedModel",
        lm_class="TransformerSeq2SeqForConditionalGeneration",
        card_template="transformer_seq2seq.md",
    ),
)

BY_NAME: dict[str, ModelFamily] = {family.name: family for family in FAMILIES}
BY_MODEL_TYPE: dict[str, ModelFamily] = {family.model_type: family for family in FAMILIES}
