"""modeling/registry.py: the one table of model families that the package root, the trainer, the
export and the model card read."""

from __future__ import annotations

import pytest
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import attention_seq2seq
from attention_seq2seq.hub import export, model_card
from attention_seq2seq.modeling.registry import BY_MODEL_TYPE, BY_NAME, FAMILIES
from attention_seq2seq.training.train_config import CHOICES


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_each_entry_names_classes_that_exist_and_agree(family):
    config_cls, base_cls, lm_cls = family.config_cls(), family.base_model_cls(), family.lm_cls()
    assert config_cls.model_type == family.model_type
    assert base_cls.config_class is config_cls and lm_cls.config_class is config_cls
    for name in family.exports():  # the package root's lazy public names
        assert getattr(attention_seq2seq, name).__name__ == name
    assert AutoConfig.for_model(family.model_type).__class__ is config_cls
    assert AutoModel._model_mapping[config_cls].__name__ == base_cls.__name__
    assert AutoModelForSeq2SeqLM._model_mapping[config_cls].__name__ == lm_cls.__name__
    assert (model_card._template(family.card_template)) and family.card_template in model_card._ARCHITECTURES


def test_every_reader_of_the_families_reads_the_registry():
    assert set(CHOICES["model_family"]) == set(BY_NAME)  # recipes' model_family
    assert export.FAMILIES is BY_MODEL_TYPE  # what an export ships and its auto_map
    assert sorted(attention_seq2seq.__all__) == sorted(
        [name for family in FAMILIES for name in family.exports()]
        + ["register_auto_classes", "TRANSLATION_METRIC_PATH", "load_translation_metric"]
    )
