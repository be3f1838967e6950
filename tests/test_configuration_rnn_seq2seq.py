"""RNNSeq2SeqConfig (configuration/configuration_rnn_seq2seq.py): validation naming the valid
values, foreign option names, unknown options and generation settings, resolved defaults."""

from __future__ import annotations

import pytest
from helpers import RNN_VOCAB as VOCAB

from attention_seq2seq import RNNSeq2SeqConfig, RNNSeq2SeqForConditionalGeneration

# ---------------------------------------------------------------------------------------------
# Configuration validation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(cell_type="rnn"), "cell_type must be one of 'gru', 'lstm'"),
        (dict(attention="vaswani"), "attention must be one of 'none', 'bahdanau', 'luong'"),
        (dict(score="dott"), "score must be one of 'dot', 'general', 'concat', 'cosine', 'scaled_dot'"),
        (dict(window="local"), "window must be one of 'global', 'local-m', 'local-p'"),
        (dict(attention_mode="sparse"), "attention_mode must be one of 'soft', 'hard'"),
        (dict(bridge="mean"), "bridge must be one of 'zero', 'last', 'projection'"),
        (dict(attention="none", window="local-m"), "window has no meaning with attention='none'"),
        (dict(attention="none", score="dot"), "score has no meaning with attention='none'"),
        (dict(attention="none", coverage=True), "coverage has no meaning with attention='none'"),
        (dict(attention="none", bridge="zero"), "never sees the source"),
        (dict(attention="bahdanau", input_feeding=True), "input_feeding is Luong's"),
        (dict(attention="bahdanau", score="general"), "always uses its additive score"),
        (dict(attention="bahdanau", window="local-p"), "needs attention='luong'"),
        (dict(window="global", window_size=5), "window_size (D) applies to window='local-m' or 'local-p' only"),
        (dict(window="local-p", window_size=0), "window_size (D) must be a positive integer"),
        (dict(score="dot", coverage=True), "coverage enters an additive score"),
        (dict(coverage_loss_weight=0.5), "coverage_loss_weight needs coverage=True"),
        (dict(bridge="last", encoder_layers=2), "needs encoder_layers == decoder_layers"),
        (dict(bridge="last", bidirectional=True, encoder_hidden_size=8), "make them equal or use bridge='projection'"),
        (dict(score="dot", encoder_hidden_size=8), "use 'general' or 'concat'"),
        (dict(tie_word_embeddings=True, embedding_size=6), "tie_word_embeddings needs"),
        (dict(hidden_size=7), "hidden_size must be even"),
        (dict(dropout=1.0), "dropout must lie in [0, 1)"),
        (dict(atention="luong"), "did you mean 'attention'"),
    ],
)
def test_invalid_configs_raise_and_name_the_valid_values(kwargs, message):
    base = dict(vocab_size=VOCAB, hidden_size=8, embedding_size=8)
    base.update(kwargs)
    with pytest.raises(ValueError) as error:
        RNNSeq2SeqConfig(**base)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "foreign, ours", [("rnn_type", "cell_type"), ("attention_type", "attention="), ("brnn", "bidirectional")]
)
def test_another_toolkits_option_name_is_refused_naming_ours(foreign, ours):
    with pytest.raises(ValueError, match=f"no option '{foreign}'.*use {ours}"):
        RNNSeq2SeqConfig(vocab_size=VOCAB, hidden_size=8, embedding_size=8, **{foreign: "lstm"})


def test_unknown_options_warn_once_and_generation_settings_move_to_generation_config():
    with pytest.warns(UserWarning) as caught:
        config = RNNSeq2SeqConfig(vocab_size=VOCAB, hidden_size=8, embedding_size=8, colour="blue", num_beams=2)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2
    assert "generation setting(s) num_beams=2" in messages[0] and "unknown option(s) 'colour'" in messages[1]
    assert RNNSeq2SeqForConditionalGeneration(config).generation_config.num_beams == 2
    assert "num_beams" not in config.to_dict()


def test_config_round_trips_resolved_defaults(tmp_path):
    config = RNNSeq2SeqConfig(vocab_size=VOCAB, hidden_size=8, embedding_size=8, window="local-p")
    assert (config.score, config.window_size, config.input_feeding, config.attention_mode) == (
        "general",
        10,
        True,
        "soft",
    )
    config.save_pretrained(tmp_path)
    assert RNNSeq2SeqConfig.from_pretrained(tmp_path).to_dict() == config.to_dict()


def test_a_config_loads_what_it_saved_after_transformers_helpers_set_generic_names(tmp_path):
    """transformers' own test helper sets layer_norm_eps, norm_eps, ... on any config; the folder
    save_pretrained writes must load back (a user typing them still gets the warning or refusal)."""
    from transformers.testing_utils import set_config_for_less_flaky_test

    config = RNNSeq2SeqConfig(vocab_size=VOCAB, hidden_size=8, embedding_size=8)
    set_config_for_less_flaky_test(config)
    config.rnn_type = "lstm"  # another toolkit's name, set on the object: saved, so it must load
    RNNSeq2SeqForConditionalGeneration(config).save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"'rnn_type' \(ours: cell_type='gru' or 'lstm'\)"):
        reloaded = RNNSeq2SeqConfig.from_pretrained(tmp_path)
    assert reloaded.to_dict() == config.to_dict()
    with pytest.warns(UserWarning, match="unknown option"):
        RNNSeq2SeqForConditionalGeneration.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no option 'rnn_type'"):
        RNNSeq2SeqConfig(vocab_size=VOCAB, hidden_size=8, embedding_size=8, rnn_type="lstm")
