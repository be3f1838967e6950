"""TransformerSeq2SeqConfig (configuration/configuration_transformer_seq2seq.py): validation
naming the valid values, foreign option names, unknown options, generation settings, defaults."""

from __future__ import annotations

import pytest
from helpers import BOS, EOS, PAD, padded_batch, tiny_model_config

from attention_seq2seq import TransformerSeq2SeqConfig, TransformerSeq2SeqForConditionalGeneration

# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=18, encoder_attention_heads=4), "divisible by encoder_attention_heads"),
        (dict(decoder_attention_heads=5), "divisible by decoder_attention_heads"),
        (dict(position_embedding_type="rotary"), "'sinusoidal', 'learned'; got 'rotary'"),
        (dict(norm_order="sandwich"), "'post', 'pre'; got 'sandwich'"),
        (dict(norm_type="rms_norm"), "norm_type must be one of 'layer_norm', 'scale_norm'; got 'rms_norm'"),
        (dict(activation_function="swish"), "'relu', 'gelu'; got 'swish'"),
        (dict(label_smoothing=1.0), "label_smoothing"),
        (dict(d_modle=64), "unknown option 'd_modle'.*did you mean 'd_model'"),
    ],
)
def test_invalid_config_raises_naming_valid_values(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        tiny_model_config(preset="small", **overrides)


@pytest.mark.parametrize(
    "foreign, ours",
    [
        ("normalize_before", "norm_order='pre'"),
        ("encoder_normalize_before", "norm_order='pre'"),
        ("share_all_embeddings", "share_encoder_decoder_embeddings"),
        ("activation_fn", "activation_function"),
    ],
)
def test_another_toolkits_option_name_is_refused_naming_ours(foreign, ours):
    """fairseq's normalize_before=True used to build a post-norm model without a word."""
    with pytest.raises(ValueError, match=f"no option '{foreign}'.*use {ours}"):
        tiny_model_config(preset="small", **{foreign: True})


def test_an_unknown_option_is_stored_with_one_warning_but_a_saved_config_loads_silently(tmp_path, recwarn):
    import warnings

    with pytest.warns(UserWarning, match="unknown option.*'colour'") as caught:
        # hidden_size: an alias of d_model, no warning
        config = tiny_model_config(preset="small", colour="blue", hidden_size=16)
    assert len(caught) == 1 and "hidden_size" not in str(caught[0].message)
    assert config.colour == "blue"
    TransformerSeq2SeqForConditionalGeneration(tiny_model_config(preset="small")).save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # config.json's bookkeeping keys (model_type, ...) warn about nothing
        TransformerSeq2SeqConfig.from_pretrained(tmp_path)
        TransformerSeq2SeqForConditionalGeneration.from_pretrained(tmp_path)


def test_generation_settings_given_to_the_config_move_into_generation_config(tmp_path):
    """num_beams=3, max_new_tokens=7, length_penalty=0.8 passed to the config: one warning, and
    generate() uses them (before: num_beams and length_penalty were dropped, max_new_tokens landed
    in config.json, and generate() ran 5 beams for up to 128 tokens)."""
    import json

    with pytest.warns(
        UserWarning, match="num_beams=3, max_new_tokens=7, length_penalty=0.8.*generation_config"
    ) as caught:
        config = tiny_model_config(preset="small", num_beams=3, max_new_tokens=7, length_penalty=0.8)
    assert len(caught) == 1
    model = TransformerSeq2SeqForConditionalGeneration(config).eval()
    generation = model.generation_config
    assert (generation.num_beams, generation.max_new_tokens, generation.length_penalty) == (3, 7, 0.8)
    input_ids, attention_mask, _ = padded_batch()
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, suppress_tokens=[EOS])
    assert out.shape == (2, 1 + 7)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not {"num_beams", "max_new_tokens", "length_penalty", "_generation_settings"} & saved.keys()
    reloaded = TransformerSeq2SeqForConditionalGeneration.from_pretrained(tmp_path).generation_config
    assert (reloaded.num_beams, reloaded.max_new_tokens, reloaded.length_penalty) == (3, 7, 0.8)


def test_config_defaults_follow_the_paper_and_the_token_contract():
    config = TransformerSeq2SeqConfig()
    assert (config.d_model, config.encoder_layers, config.decoder_attention_heads, config.encoder_ffn_dim) == (
        512,
        6,
        8,
        2048,
    )
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id, config.decoder_start_token_id) == (
        PAD,
        BOS,
        EOS,
        BOS,
    )
    assert (config.position_embedding_type, config.norm_order, config.scale_embedding) == ("sinusoidal", "post", True)


def test_a_config_loads_what_it_saved_after_transformers_helpers_set_generic_names(tmp_path):
    """transformers' own test helper sets layer_norm_epsilon, norm_eps, ... on any config;
    save_pretrained writes them, and the folder used to be refused ("did you mean 'layer_norm_eps'?")."""
    import json

    from transformers.testing_utils import set_config_for_less_flaky_test

    config = tiny_model_config(preset="small")
    set_config_for_less_flaky_test(config)  # layer_norm_eps = 1.0, and six generic names beside it
    TransformerSeq2SeqForConditionalGeneration(config).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["layer_norm_epsilon"] == 1.0
    with pytest.warns(UserWarning, match=r"unknown option.*'layer_norm_epsilon' \(ours: layer_norm_eps\)"):
        reloaded = TransformerSeq2SeqConfig.from_pretrained(tmp_path)
    assert reloaded.to_dict() == config.to_dict()
    with pytest.warns(UserWarning, match="unknown option"):
        model = TransformerSeq2SeqForConditionalGeneration.from_pretrained(tmp_path)
    assert model.config.layer_norm_eps == 1.0


def test_a_saved_config_with_another_toolkits_name_loads_but_a_users_is_refused(tmp_path):
    """The guard refuses what a user types; a folder save_pretrained wrote loads, naming ours."""
    config = tiny_model_config(preset="small")
    config.normalize_before = True
    config.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"'normalize_before' \(ours: norm_order='pre'\)"):
        assert TransformerSeq2SeqConfig.from_pretrained(tmp_path).normalize_before is True
    with pytest.raises(ValueError, match="no option 'normalize_before'.*use norm_order='pre'"):
        tiny_model_config(preset="small", normalize_before=True)
