"""The RNN encoder-decoder as a transformers model (modeling/modeling_rnn_seq2seq.py): masking,
batching, incremental decoding, beam search and its cache, loss, save/load, config validation, and
overfitting real Multi30k pairs with every decoder variant."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoConfig, AutoModelForSeq2SeqLM
from transformers.modeling_outputs import Seq2SeqLMOutput

from attention_seq2seq import RNNSeq2SeqConfig, RNNSeq2SeqForConditionalGeneration
from attention_seq2seq.modeling.modeling_rnn_seq2seq import RNNDecoderCache, shift_tokens_right
from helpers import (
    BOS,
    EOS,
    PAD,
    RNN_VARIANTS,
    RNN_VOCAB,
    UNK,
    pad_rows,
    read_pairs,
    rnn_model,
    source_batch,
    target_batch,
)

ALL = list(RNN_VARIANTS)
ATTENDING = [v for v in RNN_VARIANTS if RNN_VARIANTS[v]["attention"] != "none"]
STEPWISE = [v for v in RNN_VARIANTS if RNNSeq2SeqConfig(**RNN_VARIANTS[v]).is_stepwise]  # decoded one step at a time


# ---------------------------------------------------------------------------------------------
# Masking and batching
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ATTENDING)
def test_cross_attention_is_zero_on_padding_and_sums_to_one(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True
    )
    (weights,) = out.cross_attentions
    assert weights.shape == (3, 1, decoder_input_ids.size(1), input_ids.size(1))
    padding = ~attention_mask.bool()[:, None, None, :].expand_as(weights)
    assert (weights[padding] == 0).all()
    totals = weights.sum(-1)
    if model.config.window == "local-p":
        # eq. 10 scales the softmax by a Gaussian ≤ 1: the mass is positive and at most one.
        assert (totals > 0).all() and (totals <= 1 + 1e-6).all()
    else:
        torch.testing.assert_close(totals, torch.ones_like(totals))
    if model.config.attention_mode == "hard":
        assert ((weights == 0) | (weights == 1)).all()


@pytest.mark.parametrize("variant", ALL)
def test_batch_gives_the_same_logits_as_each_sentence_alone(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, decoder_mask = target_batch()
    batched = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True
    )
    for b in range(3):
        src_len, tgt_len = int(attention_mask[b].sum()), int(decoder_mask[b].sum())
        alone = model(
            input_ids=input_ids[b : b + 1, :src_len],
            decoder_input_ids=decoder_input_ids[b : b + 1, :tgt_len],
            output_attentions=True,
        )
        torch.testing.assert_close(batched.logits[b, :tgt_len], alone.logits[0], atol=1e-5, rtol=1e-5)
        if alone.cross_attentions is not None:
            torch.testing.assert_close(
                batched.cross_attentions[0][b, :, :tgt_len, :src_len],
                alone.cross_attentions[0][0],
                atol=1e-6,
                rtol=1e-5,
            )


def test_padding_never_enters_the_encoder_state():
    model = rnn_model("none-gru-last")
    input_ids, attention_mask = source_batch()
    encoder = model.get_encoder()
    batched = encoder(input_ids, attention_mask)
    alone = encoder(input_ids[1:2, :2])
    torch.testing.assert_close(batched.final_hidden_state[1], alone.final_hidden_state[0])
    assert (batched.last_hidden_state[1, 2:] == 0).all()


# ---------------------------------------------------------------------------------------------
# Incremental decoding and generation
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# Step order: Bahdanau scores s_{i-1} before the RNN step, Luong scores h_t after it
# ---------------------------------------------------------------------------------------------


def _run_double(variant, **overrides):
    model = rnn_model(variant, **overrides).double()
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_attentions=True,
        output_hidden_states=True,
    )
    encoder_outputs = model.get_encoder()(input_ids, attention_mask)
    return model, out, encoder_outputs, attention_mask.bool(), decoder_input_ids


def _gru_step(rnn, x, h):
    """One GRU step written out (Cho et al. 2014), weights from torch's single-layer GRU."""
    r_i, z_i, n_i = (x @ rnn.weight_ih_l0.T + rnn.bias_ih_l0).chunk(3, -1)
    r_h, z_h, n_h = (h @ rnn.weight_hh_l0.T + rnn.bias_hh_l0).chunk(3, -1)
    r, z = torch.sigmoid(r_i + r_h), torch.sigmoid(z_i + z_h)
    n = torch.tanh(n_i + r * n_h)
    return (1 - z) * n + z * h


def test_bahdanau_predicts_from_the_previous_state_and_feeds_the_context_to_the_rnn_and_output():
    model, out, encoder_outputs, mask, decoder_input_ids = _run_double("bahdanau-gru")
    decoder = model.model.decoder
    h = encoder_outputs.last_hidden_state  # (batch, src_len, encoder_output_size)
    s_prev = decoder.bridge(encoder_outputs.final_hidden_state, None)[0][-1]  # s_0 = tanh(W_s h_last)
    (weights,) = out.cross_attentions
    (states,) = out.decoder_hidden_states
    embeds = decoder.embed_tokens(decoder_input_ids)
    keys = decoder.attention.k_proj(h)
    for i in range(decoder_input_ids.size(1)):
        # A.1.2: e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j); eq. 6: softmax over the real source
        scores = torch.tanh(decoder.attention.q_proj(s_prev)[:, None] + keys) @ decoder.attention.v
        alpha = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)
        torch.testing.assert_close(weights[:, 0, i], alpha)
        context = (alpha[:, :, None] * h).sum(1)  # eq. 5: c_i = Σ_j α_ij h_j
        # A.2.1: s_i = f(s_{i-1}, [E y_{i-1}; c_i])
        s_i = _gru_step(decoder.rnn, torch.cat([embeds[:, i], context], -1), s_prev)
        torch.testing.assert_close(states[:, i], s_i)
        # A.2.2: t_i = maxout(U_o s_{i-1} + V_o E y_{i-1} + C_o c_i); logits = W_o t_i
        t_tilde = decoder.deep_output(torch.cat([s_prev, embeds[:, i], context], -1))
        t_i = torch.maximum(t_tilde[:, 0::2], t_tilde[:, 1::2])
        torch.testing.assert_close(out.logits[:, i], model.lm_head(t_i))
        s_prev = s_i


@pytest.mark.parametrize("input_feeding", [True, False])
def test_luong_scores_the_current_state_and_feeds_h_tilde_back(input_feeding):
    model, out, encoder_outputs, mask, decoder_input_ids = _run_double(
        "luong-general-feed-gru", input_feeding=input_feeding
    )
    decoder = model.model.decoder
    h_bar = encoder_outputs.last_hidden_state
    h_prev = decoder.bridge(encoder_outputs.final_hidden_state, None)[0][-1]
    h_tilde_prev = torch.zeros_like(h_prev)
    (weights,) = out.cross_attentions
    embeds = decoder.embed_tokens(decoder_input_ids)
    for t in range(decoder_input_ids.size(1)):
        x = torch.cat([embeds[:, t], h_tilde_prev], -1) if input_feeding else embeds[:, t]  # §3.3
        h_t = _gru_step(decoder.rnn, x, h_prev)  # the RNN steps first
        scores = (decoder.attention.k_proj(h_bar) @ h_t[:, :, None]).squeeze(-1)  # eq. 8 general: h_tᵀ W_a h̄_s
        a_t = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1)  # eq. 7
        torch.testing.assert_close(weights[:, 0, t], a_t)
        c_t = (a_t[:, :, None] * h_bar).sum(1)
        h_tilde = torch.tanh(decoder.attn_combine(torch.cat([c_t, h_t], -1)))  # eq. 5
        torch.testing.assert_close(out.logits[:, t], model.lm_head(h_tilde))  # eq. 6 (before softmax)
        h_prev, h_tilde_prev = h_t, h_tilde


@pytest.mark.parametrize("cell_type", ["gru", "lstm"])
def test_fused_decoder_step_equals_the_stacked_torch_rnn(cell_type):
    # The step-wise decoders run torch's single-step cell kernels on the stacked RNN's parameters.
    model = rnn_model("luong-general-feed-gru", cell_type=cell_type, decoder_layers=2, bridge="zero")
    decoder = model.model.decoder
    inputs = torch.randn(3, 5, decoder.rnn.input_size)
    hidden = torch.randn(2, 3, model.config.hidden_size)
    cell = torch.randn(2, 3, model.config.hidden_size) if cell_type == "lstm" else None
    expected, expected_state = decoder.rnn(inputs, hidden if cell is None else (hidden, cell))
    cache = RNNDecoderCache(hidden=hidden, cell=cell)
    steps = torch.cat([decoder._rnn_step(x, cache) for x in inputs.split(1, dim=1)], 1)
    torch.testing.assert_close(steps, expected)
    torch.testing.assert_close(cache.hidden, expected_state if cell is None else expected_state[0])
    if cell is not None:
        torch.testing.assert_close(cache.cell, expected_state[1])


@pytest.mark.parametrize("variant", ALL)
def test_incremental_decoding_with_cache_equals_teacher_forcing(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    encoder_outputs = model.get_encoder()(input_ids, attention_mask)

    # One token at a time.
    cache, steps = None, []
    for t in range(decoder_input_ids.size(1)):
        out = model(
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:, t : t + 1],
            encoder_outputs=encoder_outputs,
            cache=cache,
            use_cache=True,
        )
        cache = out.cache
        steps.append(out.logits)
    assert isinstance(cache, RNNDecoderCache) and cache.get_seq_length() == decoder_input_ids.size(1)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)

    # Uneven chunks (3 tokens, then the rest) continue from the cache as well.
    first = model(
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids[:, :3],
        encoder_outputs=encoder_outputs,
        use_cache=True,
    )
    rest = model(
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids[:, 3:],
        encoder_outputs=encoder_outputs,
        cache=first.cache,
    )
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), full, atol=1e-5, rtol=1e-5)


def _greedy_by_hand(model, input_ids, attention_mask, max_new_tokens):
    """Greedy decoding with full teacher-forced forwards (no cache), stopping rows at </s>."""
    sequences = torch.full((input_ids.size(0), 1), BOS)
    finished = torch.zeros(input_ids.size(0), dtype=torch.bool)
    for _ in range(max_new_tokens):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=sequences).logits[:, -1]
        next_tokens = logits.argmax(-1).masked_fill(finished, PAD)
        sequences = torch.cat([sequences, next_tokens[:, None]], 1)
        finished |= next_tokens == EOS
        if finished.all():
            break
    return sequences


@pytest.mark.parametrize("variant", ALL)
def test_generate_num_beams_1_equals_greedy_by_hand(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    generated = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, num_beams=1, do_sample=False, max_new_tokens=7
    )
    expected = _greedy_by_hand(model, input_ids, attention_mask, 7)
    assert torch.equal(generated, expected[:, : generated.size(1)])
    assert generated.size(1) == expected.size(1)


@pytest.mark.parametrize("variant", ALL)
def test_beam_search_with_and_without_cache_agree(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=4,
        num_return_sequences=2,
        length_penalty=0.6,
        max_new_tokens=8,
        return_dict_in_generate=True,
        output_scores=True,
    )
    cached = model.generate(**kwargs, use_cache=True)
    uncached = model.generate(**kwargs, use_cache=False)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=1e-5)
    assert cached.sequences.size(0) == 6


@pytest.mark.parametrize(
    "variant",
    ["bahdanau-lstm-coverage", "luong-general-feed-local-p-lstm", "luong-concat-nofeed-coverage", "none-gru-last"],
)
def test_reorder_cache_selects_every_tensor_row(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    cache = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, use_cache=True
    ).cache
    config = model.config
    expected_fields = {"hidden"}
    expected_fields |= {"cell"} if config.cell_type == "lstm" else set()
    expected_fields |= {"keys"} if config.attention != "none" else set()
    expected_fields |= {"attentional_state"} if config.input_feeding else set()
    expected_fields |= {"coverage"} if config.coverage else set()
    before = {name: tensor.clone() for name, tensor in cache.tensors().items()}
    assert set(before) == expected_fields
    for name, tensor in before.items():  # rows differ, so a wrong index cannot go unnoticed
        dim = RNNDecoderCache._BATCH_DIM[name]
        rows = [tensor.select(dim, b) for b in range(3)]
        assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[1], rows[2]), name

    beam_idx = torch.tensor([2, 0, 0])
    cache.reorder_cache(beam_idx)
    for name, old in before.items():
        new = getattr(cache, name)
        dim = RNNDecoderCache._BATCH_DIM[name]
        assert new.shape == old.shape
        for new_row, old_row in enumerate(beam_idx.tolist()):
            assert torch.equal(new.select(dim, new_row), old.select(dim, old_row)), (name, new_row)


@pytest.mark.parametrize("variant", ["bahdanau-gru", "luong-general-feed-gru", "luong-dot-nofeed-lstm-last-bridge"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_returns_cross_attentions_in_the_documented_layout(variant, num_beams):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=num_beams,
        max_new_tokens=4,
        min_new_tokens=4,
        return_dict_in_generate=True,
        output_attentions=True,
    )
    rows = 3 * num_beams
    assert len(out.cross_attentions) == out.sequences.size(1) - 1  # one entry per generated token
    for step in out.cross_attentions:
        assert isinstance(step, tuple) and len(step) == 1
        (weights,) = step
        assert weights.shape == (rows, 1, 1, input_ids.size(1))
        mask = attention_mask.repeat_interleave(num_beams, 0).bool()
        assert (weights[:, 0, 0][~mask] == 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(rows, 1, 1))
    if num_beams == 1:
        # The attention recorded during generation equals a teacher-forced pass over the output.
        forced = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=out.sequences[:, :-1],
            output_attentions=True,
        )
        stacked = torch.cat([step[0] for step in out.cross_attentions], dim=2)
        torch.testing.assert_close(stacked, forced.cross_attentions[0], atol=1e-6, rtol=1e-5)


def test_prepare_inputs_for_generation_feeds_only_unseen_tokens():
    model = rnn_model("bahdanau-gru")
    input_ids, attention_mask = source_batch()
    encoder_outputs = model.get_encoder()(input_ids, attention_mask)
    prefix = torch.tensor([[BOS, 13, 14, 15]] * 3)
    no_cache = model.prepare_inputs_for_generation(
        prefix, attention_mask=attention_mask, encoder_outputs=encoder_outputs
    )
    assert torch.equal(no_cache["decoder_input_ids"], prefix)
    cache = model(
        attention_mask=attention_mask, decoder_input_ids=prefix[:, :3], encoder_outputs=encoder_outputs, use_cache=True
    ).cache
    with_cache = model.prepare_inputs_for_generation(
        prefix, cache=cache, attention_mask=attention_mask, encoder_outputs=encoder_outputs
    )
    assert torch.equal(with_cache["decoder_input_ids"], prefix[:, 3:])
    assert with_cache["cache"] is cache and with_cache["attention_mask"] is attention_mask


def test_generation_defaults_live_in_generation_config():
    model = rnn_model("bahdanau-gru")
    gen = model.generation_config
    assert (gen.num_beams, gen.max_new_tokens) == (5, 128)
    assert (gen.decoder_start_token_id, gen.eos_token_id, gen.pad_token_id) == (BOS, EOS, PAD)
    input_ids, attention_mask = source_batch()
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3)
    assert (out[:, 0] == BOS).all()


def test_an_explicit_max_length_beats_the_default_max_new_tokens():
    """generate(max_length=N) stops at N decoder tokens; before, the model's max_new_tokens=128 won
    (129 tokens). </s> is suppressed so that only the length limit can stop decoding."""
    model = rnn_model("bahdanau-gru")
    input_ids, attention_mask = source_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, suppress_tokens=[EOS])
    assert model.generate(**kwargs, max_length=7).shape == (3, 7)
    assert model.generate(**kwargs, max_length=7, num_beams=1).shape == (3, 7)
    assert model.generate(**kwargs, max_new_tokens=4).shape == (3, 5)
    assert model.generation_config.max_new_tokens == 128


@pytest.mark.parametrize("variant", ["bahdanau-gru", "luong-dot-nofeed-lstm-last-bridge"])
def test_sampling_with_top_k_1_equals_greedy(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=6)
    sampled = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=1, num_beams=1, max_new_tokens=6
    )
    assert torch.equal(sampled, greedy)


@pytest.mark.parametrize("cell_type", ["gru", "lstm"])
@pytest.mark.parametrize("bridge", ["zero", "last", "projection"])
def test_bridge_builds_each_decoder_layer_from_the_same_encoder_layer(cell_type, bridge):
    model = rnn_model("luong-general-feed-gru", cell_type=cell_type, bridge=bridge, encoder_layers=2, decoder_layers=2)
    input_ids, attention_mask = source_batch()
    encoder_outputs = model.get_encoder()(input_ids, attention_mask)
    bridge_module = model.model.decoder.bridge
    hidden, cell = bridge_module(encoder_outputs.final_hidden_state, encoder_outputs.final_cell_state)
    assert hidden.shape == (2, 3, model.config.hidden_size)
    assert (cell is not None) == (cell_type == "lstm")
    finals = [(hidden, encoder_outputs.final_hidden_state, "hidden_proj")]
    if cell_type == "lstm":
        finals.append((cell, encoder_outputs.final_cell_state, "cell_proj"))
    for state, final, projections in finals:
        for layer in range(2):
            if bridge == "zero":
                expected = torch.zeros_like(state[layer])
            elif bridge == "last":
                expected = final[:, layer]  # [h→_S; h←_1] of encoder layer l
            else:
                linear = getattr(bridge_module, projections)[layer]
                expected = torch.tanh(final[:, layer] @ linear.weight.T + linear.bias)
            torch.testing.assert_close(state[layer], expected)


# ---------------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------------


def _labels():
    ids, mask = target_batch()
    labels = torch.cat([ids[:, 1:], torch.zeros(3, 1, dtype=torch.long)], 1)
    lengths = mask.sum(1)
    for b in range(3):
        labels[b, lengths[b] - 1] = EOS
        labels[b, lengths[b] :] = -100
    return labels


def test_outputs_are_seq2seq_lm_outputs_with_hidden_states():
    model = rnn_model("luong-general-feed-gru")
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_hidden_states=True,
    )
    assert isinstance(out, Seq2SeqLMOutput)
    assert out.loss is None  # no labels, no loss
    assert isinstance(out.cache, RNNDecoderCache)  # config.use_cache, as in other HF seq2seq models
    (encoder_states,) = out.encoder_hidden_states
    assert torch.equal(encoder_states, out.encoder_last_hidden_state)
    (decoder_states,) = out.decoder_hidden_states
    assert decoder_states.shape == (3, decoder_input_ids.size(1), model.config.hidden_size)
    as_tuple = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        use_cache=False,
        return_dict=False,
    )
    assert torch.equal(as_tuple[0], out.logits)
    assert not any(isinstance(item, RNNDecoderCache) for item in as_tuple)


@pytest.mark.parametrize("variant", ["luong-dot-nofeed-lstm-last-bridge", "bahdanau-gru"])
@pytest.mark.parametrize("output_hidden_states", [False, True])
def test_encoder_outputs_may_be_passed_as_a_tuple(variant, output_hidden_states):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    as_tuple = model.get_encoder()(
        input_ids, attention_mask, output_hidden_states=output_hidden_states, return_dict=False
    )
    assert isinstance(as_tuple, tuple)
    expected = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    got = model(encoder_outputs=as_tuple, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    assert torch.equal(got, expected)


@pytest.mark.parametrize("variant", ["luong-dot-nofeed-lstm-last-bridge", "bahdanau-gru"])
def test_generate_from_encoder_outputs_as_a_tuple_with_beams(variant):
    """generate(encoder_outputs=<tuple>, num_beams=3) translates as generate(input_ids=...); before,
    transformers' expansion for the beams raised "TypeError: only integer tensors of a single
    element can be converted to an index"."""
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    as_tuple = model.get_encoder()(input_ids, attention_mask, return_dict=False)
    kwargs = dict(attention_mask=attention_mask, max_new_tokens=6, num_beams=3)
    expected = model.generate(input_ids=input_ids, **kwargs)
    assert torch.equal(model.generate(encoder_outputs=as_tuple, **kwargs), expected)
    two = model.generate(encoder_outputs=as_tuple, num_return_sequences=2, **kwargs)
    assert torch.equal(two, model.generate(input_ids=input_ids, num_return_sequences=2, **kwargs))


def test_a_source_row_without_real_tokens_is_refused_naming_the_row():
    model = rnn_model("bahdanau-gru")
    input_ids, attention_mask = source_batch()
    attention_mask[1] = 0
    message = r"attention_mask row\(s\) \[1\] are all 0: every source sentence needs at least one real token"
    with pytest.raises(ValueError, match=message):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=input_ids)
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3)


def test_labels_are_shifted_right_into_decoder_input_ids():
    labels = torch.tensor([[7, 8, EOS], [9, EOS, -100]])
    assert shift_tokens_right(labels, PAD, BOS).tolist() == [[BOS, 7, 8], [BOS, 9, EOS]]


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_loss_is_mean_smoothed_cross_entropy_over_non_ignored_labels(label_smoothing):
    model = rnn_model("luong-general-feed-gru", label_smoothing=label_smoothing)
    input_ids, attention_mask = source_batch()
    labels = _labels()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    explicit = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=shift_tokens_right(labels, PAD, BOS)
    )
    torch.testing.assert_close(out.logits, explicit.logits)
    # Hand: mean over the real tokens of -(1-ε) log p(y) - ε/V Σ_v log p(v).
    log_probs = out.logits.log_softmax(-1)
    terms = []
    for b in range(3):
        for t in range(labels.size(1)):
            if labels[b, t] != -100:
                nll = -log_probs[b, t, labels[b, t]]
                terms.append((1 - label_smoothing) * nll - label_smoothing / RNN_VOCAB * log_probs[b, t].sum())
    torch.testing.assert_close(out.loss, torch.stack(terms).mean())


@pytest.mark.parametrize("variant", ["bahdanau-lstm-coverage", "luong-concat-nofeed-coverage"])
def test_coverage_loss_adds_lambda_times_mean_overlap_with_past_attention(variant):
    model = rnn_model(variant, coverage_loss_weight=0.7)
    input_ids, attention_mask = source_batch()
    labels = _labels()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_attentions=True)
    weights = out.cross_attentions[0][:, 0]  # (batch, tgt_len, src_len)
    penalties = []
    for b in range(3):
        coverage = torch.zeros(weights.size(-1))
        for t in range(labels.size(1)):
            # See et al. (2017), eq. 12: Σ_i min(a_i^t, c_i^t), c^t = Σ_{t'<t} a^{t'}
            if labels[b, t] != -100:
                penalties.append(torch.minimum(weights[b, t], coverage).sum())
            coverage = coverage + weights[b, t]
    cross_entropy = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
    torch.testing.assert_close(out.loss, cross_entropy + 0.7 * torch.stack(penalties).mean())
    # The per-token penalty is exposed for trainers that build their own loss from the logits.
    torch.testing.assert_close(out.coverage_penalty[labels != -100], torch.stack(penalties))
    # The coverage term is not zero here, so the check above is not vacuous.
    assert torch.stack(penalties).mean() > 1e-3


def test_cosine_score_in_half_precision_on_a_padded_batch_gives_finite_gradients():
    """model.half() with the cosine score: padded encoder states are exact zeros, and
    F.normalize's eps (1e-8) rounds to 0 in float16, so their 0/0 sent NaN into every gradient.
    Unit vectors are now taken in float32, zero vectors kept at zero without a gradient."""
    model = rnn_model("luong-cosine-feed-2layers").train().half()
    input_ids, attention_mask = source_batch()  # lengths 5, 2, 4: padded
    labels, _ = target_batch()
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    not_finite = [name for name, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()]
    assert not not_finite
    assert model.model.decoder.attention.key_strength.weight.grad.abs().sum() > 0

    from attention_seq2seq.modeling.rnn_attention import unit_vectors

    states = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-3, 0.0]], requires_grad=True)
    unit = unit_vectors(states)
    torch.testing.assert_close(unit, torch.tensor([[0.6, 0.8], [0.0, 0.0], [1.0, 0.0]]))
    unit.sum().backward()
    assert states.grad[1].tolist() == [0.0, 0.0] and states.grad.isfinite().all()


def test_coverage_enters_the_score():
    model = rnn_model("bahdanau-lstm-coverage")
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    with_coverage = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True
    )
    with torch.no_grad():
        model.model.decoder.attention.coverage_proj.weight.zero_()
    without = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, output_attentions=True
    )
    # Step 0 has zero coverage either way; later steps must differ.
    torch.testing.assert_close(with_coverage.cross_attentions[0][:, :, 0], without.cross_attentions[0][:, :, 0])
    assert not torch.allclose(with_coverage.cross_attentions[0][:, :, 1:], without.cross_attentions[0][:, :, 1:])


# ---------------------------------------------------------------------------------------------
# Save / load, tying, Auto classes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "tie", "share"),
    [
        ("luong-general-feed-gru", True, True),
        ("bahdanau-lstm-coverage", True, False),
        ("luong-dot-nofeed-lstm-last-bridge", False, True),
        ("none-gru-last", False, False),
    ],
)
def test_save_and_load_give_identical_logits_and_keep_tying(tmp_path, variant, tie, share):
    # Tying needs the output vector to be embedding_size wide (Luong: hidden_size).
    model = rnn_model(variant, embedding_size=8, tie_word_embeddings=tie, share_embeddings=share)
    encoder_embed = model.model.encoder.embed_tokens.weight
    decoder_embed = model.model.decoder.embed_tokens.weight
    assert (model.lm_head.weight is decoder_embed) == tie
    assert (decoder_embed is encoder_embed) == share
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is RNNSeq2SeqForConditionalGeneration
    assert (loaded.lm_head.weight is loaded.model.decoder.embed_tokens.weight) == tie
    assert (loaded.model.decoder.embed_tokens.weight is loaded.model.encoder.embed_tokens.weight) == share
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    assert torch.equal(model(**kwargs).logits, loaded(**kwargs).logits)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert loaded.generation_config.num_beams == 5
    if tie:  # tied weights stay tied while training
        loaded.lm_head.weight.data[4] += 1.0
        assert torch.equal(loaded.model.decoder.embed_tokens.weight[4], loaded.lm_head.weight[4])


def test_auto_classes_are_registered():
    config = AutoConfig.for_model("rnn_seq2seq", vocab_size=RNN_VOCAB, hidden_size=8, embedding_size=6)
    assert isinstance(config, RNNSeq2SeqConfig)
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert isinstance(model, RNNSeq2SeqForConditionalGeneration)


def test_padding_embedding_starts_at_zero_and_init_is_uniform():
    model = rnn_model("bahdanau-gru", init_range=0.05)
    assert (model.model.encoder.embed_tokens.weight[PAD] == 0).all()
    for name, param in model.named_parameters():
        assert param.abs().max() <= 0.05, name


# ---------------------------------------------------------------------------------------------
# Every decoder variant overfits 20 real sentence pairs
# ---------------------------------------------------------------------------------------------

OVERFIT_VARIANTS = {
    "none": dict(attention="none", bridge="projection"),
    "bahdanau": dict(attention="bahdanau"),
    "bahdanau-coverage": dict(attention="bahdanau", coverage=True, coverage_loss_weight=0.1),
    "luong-general-feed": dict(attention="luong", score="general"),
    "luong-dot-nofeed": dict(attention="luong", score="dot", input_feeding=False),
    "luong-concat-nofeed": dict(attention="luong", score="concat", input_feeding=False),
    "luong-cosine-nofeed": dict(attention="luong", score="cosine", input_feeding=False),
    "luong-scaled_dot-nofeed": dict(attention="luong", score="scaled_dot", input_feeding=False),
    "luong-local-m": dict(attention="luong", window="local-m", window_size=3, input_feeding=False),
    "luong-local-p": dict(attention="luong", window="local-p", window_size=3, input_feeding=False),
    "luong-hard": dict(attention="luong", attention_mode="hard", input_feeding=False),
    "luong-lstm-feed": dict(attention="luong", cell_type="lstm"),
}


def _word_level_batch(pairs):
    """Word vocabulary built from the pairs themselves: ids 0-3 are <pad>, <s>, </s>, <unk>."""
    vocab = {"<pad>": PAD, "<s>": BOS, "</s>": EOS, "<unk>": UNK}
    for source, target in pairs:
        for word in source.split() + target.split():
            vocab.setdefault(word, len(vocab))
    sources = [[vocab[w] for w in s.split()] + [EOS] for s, _ in pairs]
    targets = [[vocab[w] for w in t.split()] + [EOS] for _, t in pairs]
    input_ids, attention_mask = pad_rows(sources)
    labels, _ = pad_rows(targets, value=-100)
    return len(vocab), input_ids, attention_mask, labels


@pytest.mark.parametrize("variant", list(OVERFIT_VARIANTS))
def test_every_decoder_variant_overfits_20_training_pairs(variant):
    vocab_size, input_ids, attention_mask, labels = _word_level_batch(read_pairs(20))
    config = RNNSeq2SeqConfig(
        vocab_size=vocab_size, embedding_size=32, hidden_size=64, dropout=0.0, **OVERFIT_VARIANTS[variant]
    )
    torch.manual_seed(0)
    model = RNNSeq2SeqForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    first = None
    for step in range(400):
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        first = loss.item() if first is None else first
        if loss.item() < 0.1:
            break
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    assert loss.item() < 0.1, f"{variant}: loss {first:.2f} -> {loss.item():.3f} after {step + 1} steps"


def test_data_collator_for_seq2seq_builds_the_decoder_inputs_the_model_would():
    """DataCollatorForSeq2Seq(model=...) calls prepare_decoder_input_ids_from_labels; the batch it
    builds must give the same loss as handing the model only the labels."""
    from transformers import DataCollatorForSeq2Seq

    model = rnn_model("luong-general-feed-gru")

    class _Tok:  # the collator only needs the padding behaviour of a tokenizer
        pad_token_id = PAD
        padding_side = "right"

        def pad(self, features, padding, max_length, pad_to_multiple_of, return_tensors):
            width = max(len(f["input_ids"]) for f in features)
            return {
                "input_ids": torch.tensor([f["input_ids"] + [PAD] * (width - len(f["input_ids"])) for f in features]),
                "attention_mask": torch.tensor(
                    [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features]
                ),
            }

    features = [
        {"input_ids": [5, 6, 7, EOS], "labels": [13, 14, 15, EOS]},
        {"input_ids": [9, EOS], "labels": [18, EOS]},
    ]
    batch = DataCollatorForSeq2Seq(_Tok(), model=model, label_pad_token_id=-100)(features)
    expected = torch.tensor([[BOS, 13, 14, 15], [BOS, 18, EOS, PAD]])
    assert torch.equal(batch["decoder_input_ids"], expected)
    with torch.no_grad():
        with_inputs = model(**batch).loss
        labels_only = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).loss
    torch.testing.assert_close(with_inputs, labels_only, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# The ecosystem's tools: quantization, hooks, LoRA (the layers are called, never bypassed)
# ---------------------------------------------------------------------------------------------

CELLS = ["gru", "lstm"]


def _ecosystem_model(variant: str, cell_type: str, **overrides):
    # Wide enough for int8 weights to keep the float model's choices; the default init range.
    return rnn_model(
        variant, cell_type=cell_type, **(dict(hidden_size=32, embedding_size=16, init_range=0.1) | overrides)
    )


@pytest.mark.parametrize("cell_type", CELLS)
@pytest.mark.parametrize("variant", ALL)
def test_dynamic_int8_quantization_then_generate_keeps_most_tokens(variant, cell_type):
    from torch import nn

    model = _ecosystem_model(variant, cell_type)
    input_ids, attention_mask = source_batch()
    kwargs = dict(attention_mask=attention_mask, num_beams=1, min_new_tokens=8, max_new_tokens=8)
    expected = model.generate(input_ids, **kwargs)
    quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear, nn.LSTM, nn.GRU}, torch.qint8)
    # Every RNN and Linear is replaced: the model can only run by calling them.
    assert type(quantized.model.decoder.rnn).__module__.startswith("torch.ao.nn.quantized.dynamic")
    assert not any(type(m) in (nn.Linear, nn.LSTM, nn.GRU) for m in quantized.modules())
    got = quantized.generate(input_ids, **kwargs)
    assert torch.equal(got[:, :2], expected[:, :2])  # the first token of every row
    assert (got == expected).float().mean() >= 0.8


@pytest.mark.parametrize("cell_type", CELLS)
@pytest.mark.parametrize("variant", ALL)
def test_a_forward_hook_on_the_decoder_rnn_fires_at_every_generate_step(variant, cell_type):
    model = rnn_model(variant, cell_type=cell_type)
    input_ids, attention_mask = source_batch()
    kwargs = dict(attention_mask=attention_mask, num_beams=1, min_new_tokens=4, max_new_tokens=4)
    expected = model.generate(input_ids, **kwargs)
    calls = []
    handle = model.model.decoder.rnn.register_forward_hook(lambda module, args, output: calls.append(args[0].shape))
    try:
        got = model.generate(input_ids, **kwargs)
    finally:
        handle.remove()
    assert torch.equal(got, expected)
    # one call per generated token, each on the one new token: (batch, 1, input_size)
    assert [shape[:2] for shape in calls] == [(3, 1)] * 4


@pytest.mark.parametrize("cell_type", CELLS)
@pytest.mark.parametrize("variant", STEPWISE)
def test_a_hooked_rnn_gives_the_fused_steps_logits_and_gradients(variant, cell_type):
    # The fused step kernels stand in for the module only while it is plain; calling the hooked
    # module instead gives the same numbers, and the same parameters get the same gradients.
    from attention_seq2seq.modeling.modeling_rnn_seq2seq import plain_cell_weights

    model = rnn_model(variant, cell_type=cell_type, dropout=0.0).train()
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, labels=decoder_input_ids)

    def loss_and_grads():
        model.zero_grad()
        out = model(**kwargs)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    assert plain_cell_weights(model.model.decoder.rnn) is not None
    fused_logits, fused_grads = loss_and_grads()
    handle = model.model.decoder.rnn.register_forward_pre_hook(lambda module, args: None)
    try:
        assert plain_cell_weights(model.model.decoder.rnn) is None
        called_logits, called_grads = loss_and_grads()
    finally:
        handle.remove()
    torch.testing.assert_close(called_logits, fused_logits, atol=1e-5, rtol=1e-5)
    assert called_grads.keys() == fused_grads.keys()
    for name, grad in fused_grads.items():
        torch.testing.assert_close(called_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_only_an_exactly_plain_rnn_takes_the_fused_step():
    from torch import nn
    from torch.nn.utils import parametrize

    from attention_seq2seq.modeling.modeling_rnn_seq2seq import plain_cell_weights

    class MyGRU(nn.GRU):
        pass

    assert plain_cell_weights(nn.GRU(4, 4, batch_first=True)) is not None
    assert plain_cell_weights(nn.LSTM(4, 4, num_layers=2, batch_first=True)) is not None
    assert plain_cell_weights(MyGRU(4, 4, batch_first=True)) is None
    hooked = nn.LSTM(4, 4, batch_first=True)
    hooked.register_forward_hook(lambda *args: None)
    assert plain_cell_weights(hooked) is None
    reparametrized = nn.GRU(4, 4, batch_first=True)
    parametrize.register_parametrization(reparametrized, "weight_hh_l0", nn.Identity())
    assert plain_cell_weights(reparametrized) is None
    global_hook = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert plain_cell_weights(nn.GRU(4, 4, batch_first=True)) is None
    finally:
        global_hook.remove()
    quantized = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.GRU(4, 4)), {nn.GRU}, torch.qint8)
    assert plain_cell_weights(quantized[0]) is None


@pytest.mark.parametrize("cell_type", CELLS)
@pytest.mark.parametrize("variant", ATTENDING)
def test_lora_on_every_attention_and_output_linear_gives_every_adapter_a_gradient(variant, cell_type):
    peft = pytest.importorskip("peft")
    from torch import nn

    model = rnn_model(variant, cell_type=cell_type, dropout=0.0)
    decoder = model.model.decoder
    targets = [f"model.decoder.attention.{name}" for name, m in decoder.attention.named_modules() if name]
    targets = [t for t in targets if isinstance(model.get_submodule(t), nn.Linear)]
    output_layer = "deep_output" if model.config.attention == "bahdanau" else "attn_combine"
    targets += [f"model.decoder.{output_layer}", "lm_head"]
    # init_lora_weights=False: B starts random, not zero, so A's gradient is not zero by construction.
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=targets, init_lora_weights=False))
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    lora(input_ids=input_ids, attention_mask=attention_mask, labels=decoder_input_ids).loss.backward()
    adapters = {name: p for name, p in lora.named_parameters() if "lora_" in name}
    assert len(adapters) == 2 * len(targets)
    without_gradient = [name for name, p in adapters.items() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without_gradient == []


# ---------------------------------------------------------------------------------------------
# Gradient checkpointing
# ---------------------------------------------------------------------------------------------


def _loss_and_gradients(model, seed=0):
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    model.zero_grad()
    torch.manual_seed(seed)  # the same dropout masks in both runs
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=decoder_input_ids).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("cell_type", CELLS)
@pytest.mark.parametrize("variant", ALL)
def test_gradient_checkpointing_gives_the_plain_backwards_gradients(variant, cell_type, dropout, use_reentrant):
    # Two layers each side so that the RNNs' own dropout between layers is inside the checkpoints;
    # torch's checkpoint restores the RNG state before recomputing, so dropout > 0 must match too.
    model = rnn_model(variant, cell_type=cell_type, dropout=dropout, encoder_layers=2, decoder_layers=2).train()
    decoder = model.model.decoder
    # Counting calls shows the checkpoints at work: backward runs each checkpointed part again.
    calls = []
    for module in (model.model.encoder.rnn, decoder.attention or decoder.rnn):
        module.register_forward_pre_hook(lambda module, args: calls.append(module))
    expected_loss, expected = _loss_and_gradients(model)
    plain_calls, calls[:] = len(calls), []
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    assert model.model.encoder.gradient_checkpointing and decoder.gradient_checkpointing
    loss, got = _loss_and_gradients(model)
    assert len(calls) == 2 * plain_calls
    # Reentrant checkpointing runs the first forward without autograd, where oneDNN may pick
    # another kernel: equal to rounding.
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-7)
    assert got.keys() == expected.keys() == {n for n, p in model.named_parameters() if p.requires_grad}
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    model.gradient_checkpointing_disable()
    assert not model.model.decoder.gradient_checkpointing


# ---------------------------------------------------------------------------------------------
# Routes that do not exist for a recurrent state: refused up front, in one line
# ---------------------------------------------------------------------------------------------


def test_assisted_generation_is_refused_up_front_for_the_stateful_rnn():
    model, assistant = rnn_model("luong-general-feed-gru"), rnn_model("bahdanau-gru")
    input_ids, attention_mask = source_batch()
    encoder_calls = []
    model.model.encoder.register_forward_pre_hook(lambda *args: encoder_calls.append(1))
    with pytest.raises(ValueError, match="^assisted generation is not supported with stateful models, such as RNN"):
        model.generate(input_ids, attention_mask=attention_mask, num_beams=1, assistant_model=assistant)
    assert encoder_calls == []  # refused before any work


@pytest.mark.parametrize("implementation", ["static", "offloaded_static", "sliding_window", "offloaded", "quantized"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_key_value_cache_implementation_is_refused_in_one_line_naming_the_supported_route(implementation, num_beams):
    model = rnn_model("luong-general-feed-gru")
    input_ids, attention_mask = source_batch()
    encoder_calls = []
    model.model.encoder.register_forward_pre_hook(lambda *args: encoder_calls.append(1))
    with pytest.raises(ValueError) as refused:
        model.generate(
            input_ids, attention_mask=attention_mask, num_beams=num_beams, cache_implementation=implementation
        )
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"cache_implementation={implementation!r} is not supported by RNNSeq2Seq")
    assert "own recurrent state" in message and "unset (or 'dynamic') for dynamic decoding" in message
    assert encoder_calls == []
    # The same refusal when the implementation comes with the model's generation config.
    model.generation_config.cache_implementation = implementation
    with pytest.raises(ValueError, match=f"^cache_implementation={implementation!r} is not supported"):
        model.generate(input_ids, attention_mask=attention_mask, num_beams=num_beams)


@pytest.mark.parametrize("variant", ["luong-general-feed-gru", "bahdanau-lstm-coverage"])
def test_cache_implementation_dynamic_is_the_rnns_own_decoding(variant):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    kwargs = dict(attention_mask=attention_mask, num_beams=3, max_new_tokens=6)
    expected = model.generate(input_ids, **kwargs)
    assert torch.equal(model.generate(input_ids, cache_implementation="dynamic", **kwargs), expected)


# ---------------------------------------------------------------------------------------------
# decoder_hidden_states are on the path to the logits
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ALL)
def test_decoder_hidden_states_are_on_the_path_to_the_logits(variant):
    # transformers' retain_grad contract: a gradient from the logits reaches the returned states.
    model = rnn_model(variant, dropout=0.0).train()
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_hidden_states=True,
    )
    (states,) = out.decoder_hidden_states  # top RNN states, (batch, tgt_len, hidden_size)
    states.retain_grad()
    out.logits.sum().backward()
    assert states.grad is not None
    # Bahdanau predicts y_i from s_{i-1}: the last state of a call reaches no logit of that call.
    reached = states.grad[:, :-1] if model.config.attention == "bahdanau" else states.grad
    assert (reached.abs().sum(-1) > 0).all()


@pytest.mark.parametrize("variant", [v for v in STEPWISE if RNN_VARIANTS[v]["attention"] == "luong"])
def test_luong_logits_depend_on_the_returned_states_through_eq_5(variant):
    # ∂(g · logits_t)/∂h_t along eq. 5 and 6: W_cᵀ [(1 - h̃_t²) ⊙ W_sᵀ g], W_c's columns that read h_t.
    model = rnn_model(variant, dropout=0.0)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_hidden_states=True,
    )
    (states,) = out.decoder_hidden_states
    g = torch.randn_like(out.logits)
    (got,) = torch.autograd.grad(out.logits, states, g)
    with torch.no_grad():
        h_tilde = model.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
        ).last_hidden_state  # h̃_t, (batch, tgt_len, hidden_size)
    w_c = model.model.decoder.attn_combine.weight  # (hidden, encoder_output_size + hidden) over [c_t; h_t]
    expected = ((g @ model.lm_head.weight) * (1 - h_tilde**2)) @ w_c[:, model.config.encoder_output_size :]
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("variant", [v for v in RNN_VARIANTS if RNN_VARIANTS[v]["attention"] == "bahdanau"])
def test_bahdanau_logits_depend_on_the_returned_states_through_the_deep_output(variant):
    # ∂(g · logits_{i+1})/∂s_i along A.2.2: U_oᵀ of the maxout's winning units of W_oᵀ g.
    model = rnn_model(variant, dropout=0.0)
    decoder = model.model.decoder
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_hidden_states=True,
        output_attentions=True,
    )
    (states,) = out.decoder_hidden_states  # s_1 .. s_T, (batch, tgt_len, hidden_size)
    g = torch.randn_like(out.logits)
    (got,) = torch.autograd.grad(out.logits, states, g)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids, attention_mask)
        s_0 = decoder.bridge(encoder_outputs.final_hidden_state, encoder_outputs.final_cell_state)[0][-1]
        contexts = out.cross_attentions[0][:, 0] @ encoder_outputs.last_hidden_state  # c_i (eq. 5)
        queries = torch.cat([s_0.unsqueeze(1), states[:, :-1]], 1)  # s_{i-1}
        embeds = decoder.embed_tokens(decoder_input_ids)
        t_tilde = decoder.deep_output(torch.cat([queries, embeds, contexts], -1))  # (batch, tgt_len, 2 * embedding)
    winners = F.one_hot(t_tilde.unflatten(-1, (-1, 2)).argmax(-1), 2).to(g.dtype)  # the unit each pool passes on
    upstream = ((g @ model.lm_head.weight).unsqueeze(-1) * winners).flatten(-2)  # ∂/∂t̃_i
    expected = upstream[:, 1:] @ decoder.deep_output.weight[:, : model.config.hidden_size]  # U_o reads s_{i-1}
    torch.testing.assert_close(got[:, :-1], expected)
    assert (got[:, -1] == 0).all()


# ---------------------------------------------------------------------------------------------
# past_key_values, the old name of cache
# ---------------------------------------------------------------------------------------------


def _deprecation_warnings(call):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    return result, [(w.category, str(w.message)) for w in caught if "past_key_values" in str(w.message)]


def _marian_warnings(**kwargs):
    """The warnings transformers' MarianMTModel gives for the same call: the behaviour to match."""
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=RNN_VOCAB, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=8, decoder_ffn_dim=8, pad_token_id=PAD,
        decoder_start_token_id=BOS, max_position_embeddings=32,
    )  # fmt: skip
    marian = MarianMTModel(config).eval()
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    first = marian(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :2])
    _, caught = _deprecation_warnings(
        lambda: marian(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids[:, 2:3],
            past_key_values=first.cache,
            **({"cache": first.cache} if kwargs.get("both") else {}),
        )
    )
    return [(category, message.replace("MarianMTModel", "{model}")) for category, message in caught]


@pytest.mark.parametrize("both", [False, True])
@pytest.mark.parametrize("variant", ["luong-general-feed-gru", "bahdanau-lstm-coverage", "none-gru-last"])
def test_past_key_values_is_accepted_as_the_old_name_of_cache_as_marian_does(variant, both):
    model = rnn_model(variant)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    first = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :2])
    old_name = {"past_key_values": first.cache}
    if both:  # cache wins: whatever comes as past_key_values is dropped unread
        old_name = {"past_key_values": object(), "cache": first.cache}
    rest, caught = _deprecation_warnings(
        lambda: model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, 2:], **old_name
        )
    )
    torch.testing.assert_close(rest.logits, full[:, 2:], atol=1e-5, rtol=1e-5)
    assert len(caught) == 1
    expected = [(c, m.format(model="RNNSeq2SeqForConditionalGeneration")) for c, m in _marian_warnings(both=both)]
    if both:  # the message names the objects passed; compare the rest
        expected = [(c, m.split("Using")[0]) for c, m in expected]
        caught = [(c, m.split("Using")[0]) for c, m in caught]
    assert caught == expected


# ---------------------------------------------------------------------------------------------
# dtype: loading in and converting to half precision
# ---------------------------------------------------------------------------------------------

HALF_ROUTES = ["from_pretrained-bfloat16", "from_pretrained-float16", "bfloat16()", "half()"]


def _half_precision_model(model, route, tmp_path):
    if route.startswith("from_pretrained"):
        dtype = getattr(torch, route.split("-")[1])
        model.save_pretrained(tmp_path)
        return AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=dtype).eval(), dtype
    copy = RNNSeq2SeqForConditionalGeneration(model.config).eval()
    copy.load_state_dict(model.state_dict())
    return (copy.bfloat16(), torch.bfloat16) if route == "bfloat16()" else (copy.half(), torch.float16)


@pytest.mark.parametrize("route", HALF_ROUTES)
@pytest.mark.parametrize("variant", ALL)
def test_half_precision_models_give_float32s_logits_and_tokens(variant, route, tmp_path):
    # init_range 0.3: logits spread wide enough that float32's choices are not near-ties.
    model = _ecosystem_model(variant, RNN_VARIANTS[variant].get("cell_type", "gru"), init_range=0.3)
    input_ids, attention_mask = source_batch()
    decoder_input_ids, _ = target_batch()
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    generate = dict(attention_mask=attention_mask, num_beams=1, min_new_tokens=6, max_new_tokens=6)
    expected_logits, expected_tokens = model(**inputs).logits, model.generate(input_ids, **generate)

    half, dtype = _half_precision_model(model, route, tmp_path)
    assert {p.dtype for p in half.parameters()} | {b.dtype for b in half.buffers()} == {dtype}
    out = half(**inputs, output_hidden_states=True, output_attentions=True)
    assert out.logits.dtype == dtype and out.decoder_hidden_states[0].dtype == dtype
    # Within a few units of bf16's 8-bit mantissa over the logits' spread. Hard attention's argmax and
    # a local window's edge |s - p_t| <= D are discontinuous: rounding may flip one, hence more room.
    spread = expected_logits.max() - expected_logits.min()
    discrete = model.config.attention_mode == "hard" or model.config.window != "global"
    room = 0.1 if discrete else 0.02
    error = (out.logits.float() - expected_logits).abs()
    assert error.max() <= room * spread
    tokens = half.generate(input_ids, **generate)
    # The first token is float32's wherever float32's choice is clearer than the half model's error
    # there (a zero bridge with hard attention starts from near-ties).
    top2 = expected_logits[:, 0].topk(2).values
    clear = top2[:, 0] - top2[:, 1] > 2 * error[:, 0].amax(-1)
    assert clear.any() and torch.equal(tokens[clear, 1], expected_tokens[clear, 1])
    assert (tokens == expected_tokens).float().mean() >= 0.75
    beams = half.generate(input_ids, **dict(generate, num_beams=3))  # beam search reorders the half state
    assert beams.shape[0] == input_ids.shape[0]
