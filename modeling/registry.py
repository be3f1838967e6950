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

    @classmethod
    def following_conventions(cls, name: str, model_type: str, class_prefix: str) -> ModelFamily:
        """A family laid out as this package's are: ``configuration_<model_type>.py`` with
        ``<prefix>Config``, ``modeling_<model_type>.py`` with ``<prefix>Model``,
        ``<prefix>PreTrainedModel`` and ``<prefix>ForConditionalGeneration``, and the card
        template ``hub_cards/<model_type>.md``."""
        return cls(
            name=name,
            model_type=model_type,
            config_module=f"configuration_{model_type}",
            config_class=f"{class_prefix}Config",
            modeling_module=f"modeling_{model_type}",
            base_model_class=f"{class_prefix}Model",
            pretrained_model_class=f"{class_prefix}PreTrainedModel",
            lm_class=f"{class_prefix}ForConditionalGeneration",
            card_template=f"{model_type}.md",
        )


FAMILIES: tuple[ModelFamily, ...] = (
    ModelFamily.following_conventions("rnn", "rnn_seq2seq", "RNNSeq2Seq"),
    ModelFamily.following_conventions("transformer", "transformer_seq2seq", "TransformerSeq2Seq"),
)

BY_NAME: dict[str, ModelFamily] = {family.name: family for family in FAMILIES}
BY_MODEL_TYPE: dict[str, ModelFamily] = {family.model_type: family for family in FAMILIES}
