"""Ensembles through generate (translation/ensemble.py): the weighted mean of the members'
log-probabilities per step, every generation option unchanged, members of both families."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM

from attention_seq2seq import RNNSeq2SeqConfig, TransformerSeq2SeqConfig
from attention_seq2seq.translation.ensemble import EnsembleForConditionalGeneration
from helpers import float32_rounding

SPECIAL = dict(vocab_size=50, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)


def _transformer(seed=0, **overrides):
    torch.manual_seed(seed)
    config = TransformerSeq2SeqConfig(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, **{**SPECIAL, **overrides},
    )  # fmt: skip
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def _rnn(seed=0, attention="luong", **overrides):
    torch.manual_seed(seed)
    config = RNNSeq2SeqConfig(embedding_size=16, hidden_size=32, attention=attention, **{**SPECIAL, **overrides})
    return AutoModelForSeq2SeqLM.from_config(config).eval()


def _batch():
    torch.manual_seed(1)
    input_ids = torch.randint(3, 50, (3, 7))
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 5:], attention_mask[1, 5:] = 0, 0  # a padded source
    return input_ids, attention_mask


DECODING = [
    dict(num_beams=1),
    dict(num_beams=4),
    dict(num_beams=4, num_return_sequences=3),
    dict(num_beams=3, no_repeat_ngram_size=2, length_penalty=0.5),
]


@pytest.mark.parametrize("family", ["transformer", "rnn-luong", "rnn-bahdanau"])
@pytest.mark.parametrize("decoding", DECODING, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_an_ensemble_of_one_decodes_exactly_as_the_model(family, decoding):
    model = {
        "transformer": _transformer,
        "rnn-luong": _rnn,
        "rnn-bahdanau": lambda: _rnn(attention="bahdanau"),
    }[family]()
    input_ids, attention_mask = _batch()
    alone = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, **decoding)
    ensemble = EnsembleForConditionalGeneration([model])
    got = ensemble.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, **decoding)
    assert torch.equal(got, alone)


def test_two_copies_of_a_model_decode_as_the_model_with_beam_search():
    model = _transformer()
    twin = copy.deepcopy(model)
    input_ids, attention_mask = _batch()
    alone = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=4)
    ensemble = EnsembleForConditionalGeneration([model, twin], weights=[3, 1])
    got = ensemble.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, num_beams=4)
    assert torch.equal(got, alone)


def test_the_step_score_is_the_weighted_mean_of_the_members_log_probabilities():
    transformer, rnn = _transformer(), _rnn()
    input_ids, attention_mask = _batch()
    target = torch.randint(3, 50, (3, 5))
    ensemble = EnsembleForConditionalGeneration([transformer, rnn], weights=[2, 1])
    with torch.no_grad():
        got = ensemble(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=target).logits
        by_hand = sum(
            w
            * torch.log_softmax(
                m(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=target).logits, -1
            )
            for w, m in ((2 / 3, transformer), (1 / 3, rnn))
        )
    # a weighted sum of two log-probabilities: float32 rounding of a sum of 2 (helpers.float32_rounding)
    torch.testing.assert_close(got, by_hand, rtol=0, atol=float32_rounding(by_hand, 2))


def test_greedy_ensemble_decoding_is_the_argmax_of_the_mixed_step_scores_with_caches():
    # RNN + Transformer: each member's own cache through generate equals re-reading the whole
    # prefix teacher-forced at every step (no cache).
    ensemble = EnsembleForConditionalGeneration([_transformer(), _rnn()], weights=[1, 1])
    input_ids, attention_mask = _batch()
    prefix = torch.full((3, 1), SPECIAL["decoder_start_token_id"])
    with torch.no_grad():
        for _ in range(8):
            step = ensemble(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=prefix).logits
            prefix = torch.cat([prefix, step[:, -1].argmax(-1, keepdim=True)], dim=1)
    got = ensemble.generate(
        input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8, min_new_tokens=8, num_beams=1
    )
    assert torch.equal(got, prefix)


def test_beam_search_of_a_mixed_ensemble_matches_decoding_without_caches():
    ensemble = EnsembleForConditionalGeneration([_transformer(seed=3), _rnn(seed=4), _rnn(seed=5)])
    input_ids, attention_mask = _batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=9, num_beams=4)
    with_cache = ensemble.generate(**kwargs)
    without = ensemble.generate(**kwargs, use_cache=False)
    assert torch.equal(with_cache, without)
    scored = ensemble.generate(**kwargs, num_return_sequences=2, output_scores=True, return_dict_in_generate=True)
    assert scored.sequences.shape[0] == 6 and torch.isfinite(scored.sequences_scores).all()


def test_sampling_an_ensemble_of_one_draws_the_model_s_samples():
    model = _rnn()
    input_ids, attention_mask = _batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=10, do_sample=True, top_k=20)
    torch.manual_seed(7)
    alone = model.generate(**kwargs)
    torch.manual_seed(7)
    got = EnsembleForConditionalGeneration([model]).generate(**kwargs)
    assert torch.equal(got, alone)


def test_members_with_another_vocabulary_or_bad_weights_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"one vocabulary: A has vocab_size=50, B has vocab_size=60"):
        EnsembleForConditionalGeneration([_transformer(), _rnn(vocab_size=60)], names=["A", "B"])
    with pytest.raises(ValueError, match="eos_token_id"):
        EnsembleForConditionalGeneration([_transformer(), _rnn(eos_token_id=3)])
    with pytest.raises(ValueError, match="2 weight"):
        EnsembleForConditionalGeneration([_transformer()], weights=[1, 1])
    with pytest.raises(ValueError, match=">= 0"):
        EnsembleForConditionalGeneration([_transformer(), _rnn()], weights=[1, -1])
    with pytest.raises(ValueError, match="cache_implementation"):
        input_ids, attention_mask = _batch()
        EnsembleForConditionalGeneration([_transformer()]).generate(
            input_ids=input_ids, attention_mask=attention_mask, cache_implementation="static", max_new_tokens=3
        )
