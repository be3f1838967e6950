"""Behaviour of the Transformer encoder-decoder (modeling/modeling_transformer_seq2seq.py).

Tiny seeded configs, parametrized over both norm orders and both position types where the
behaviour could depend on them. Numbers are compared with float64 hand computations, incremental
decoding with teacher forcing, batches with single sentences, and so on.
"""

from __future__ import annotations

import math

import pytest
import torch

from attention_seq2seq import (
    TransformerSeq2SeqForConditionalGeneration,
    TransformerSeq2SeqModel,
)
from attention_seq2seq.modeling import cpu_fast_paths, modeling_transformer_seq2seq
from attention_seq2seq.modeling.modeling_transformer_seq2seq import (
    TransformerSeq2SeqAttention,
    label_smoothed_cross_entropy,
    scaled_dot_product_attention,
    shift_tokens_right,
    sinusoidal_position_encoding,
)
from helpers import BOS, EOS, PAD, UNK, padded_batch, read_pairs, tiny_model, tiny_model_config

VARIANTS = [
    pytest.param(dict(norm_order=norm, position_embedding_type=pos), id=f"{norm}-norm-{pos}")
    for norm in ("post", "pre")
    for pos in ("sinusoidal", "learned")
] + [  # Nguyen & Salazar 2019's low-resource setup: pre-norm ScaleNorm with FixNorm embeddings
    pytest.param(dict(norm_order="pre", norm_type="scale_norm", fix_norm=True), id="pre-scalenorm-fixnorm")
]


# --------------------------------------------------------------------------------------------
# Equations against float64 hand computations
# --------------------------------------------------------------------------------------------


def _softmax64(scores: torch.Tensor) -> torch.Tensor:
    exp = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
    return exp / exp.sum(dim=-1, keepdim=True)


def test_scaled_dot_product_attention_equals_float64_hand_computation():
    query, key, value = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4), torch.randn(2, 3, 6, 4)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False  # the second sequence has 4 real keys
    output, weights = scaled_dot_product_attention(query, key, value, mask)

    q, k, v = query.double(), key.double(), value.double()
    expected = torch.empty(2, 3, 5, 4, dtype=torch.float64)
    for b in range(2):
        keys = 6 if b == 0 else 4
        for h in range(3):
            probs = _softmax64(q[b, h] @ k[b, h, :keys].T / math.sqrt(4))
            expected[b, h] = probs @ v[b, h, :keys]
    torch.testing.assert_close(output.double(), expected, atol=1e-6, rtol=1e-5)
    assert weights[1, :, :, 4:].abs().max() == 0  # padding gets exactly zero weight
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))


def test_causal_scaled_dot_product_attention_sees_only_the_past():
    query, key, value = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    output, weights = scaled_dot_product_attention(query, key, value, is_causal=True)
    for t in range(4):
        q, k = query[0, :, t : t + 1].double(), key[0, :, : t + 1].double()
        probs = _softmax64(q @ k.transpose(-1, -2) / math.sqrt(3))
        torch.testing.assert_close(output[0, :, t].double(), (probs @ value[0, :, : t + 1].double())[:, 0])
    assert torch.triu(weights[0, 0], diagonal=1).abs().max() == 0


def test_parameter_free_self_attention_softmax_xxt_x():
    """The second seed's parameter-free self-attention: y = softmax(X Xᵀ) X."""
    x = torch.randn(1, 1, 5, 8)
    output, _ = scaled_dot_product_attention(x, x, x, scaling=1.0)
    x64 = x[0, 0].double()
    torch.testing.assert_close(output[0, 0].double(), _softmax64(x64 @ x64.T) @ x64)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_multi_head_attention_with_identity_projections_is_per_head_softmax_xxt_x(attn_implementation):
    """W^Q = W^K = W^V = W^O = I: head i is softmax(X_i X_iᵀ / √d_k) X_i on its slice of features."""
    config = tiny_model_config(preset="small", d_model=8, encoder_attention_heads=2)
    config._attn_implementation = attn_implementation
    attention = TransformerSeq2SeqAttention(config, num_heads=2).eval()
    with torch.no_grad():
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
            projection.weight.copy_(torch.eye(8))
            projection.bias.zero_()
        attention.out_proj.weight.copy_(torch.eye(8))
        attention.out_proj.bias.zero_()
    x = torch.randn(1, 5, 8)
    output, _ = attention(x)
    x64 = x[0].double()
    heads = [_softmax64(xi @ xi.T / math.sqrt(4)) @ xi for xi in x64.split(4, dim=-1)]
    torch.testing.assert_close(output[0].double(), torch.cat(heads, dim=-1))


def test_multi_head_cross_attention_layer_equals_float64_hand_computation():
    config = tiny_model_config(preset="small", d_model=12, decoder_attention_heads=3)
    config._attn_implementation = "eager"
    attention = TransformerSeq2SeqAttention(config, num_heads=3, is_cross_attention=True).eval()
    with torch.no_grad():
        for p in attention.parameters():
            p.normal_(0, 0.3)
    queries, memory = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3], dtype=torch.bool)[:, None, None, :]
    output, weights = attention(queries, key_value_states=memory, attention_mask=mask)

    w_q, b_q = attention.q_proj.weight.double(), attention.q_proj.bias.double()
    w_k, w_v = attention.k_proj.weight.double(), attention.v_proj.weight.double()
    b_k, b_v = attention.k_proj.bias.double(), attention.v_proj.bias.double()
    expected = torch.empty(2, 4, 12, dtype=torch.float64)
    for n in range(2):
        src = 6 if n == 0 else 3
        q = queries[n].double() @ w_q.T + b_q
        k = memory[n, :src].double() @ w_k.T + b_k
        v = memory[n, :src].double() @ w_v.T + b_v
        heads = []
        for h in range(3):
            cols = slice(4 * h, 4 * h + 4)
            heads.append(_softmax64(q[:, cols] @ k[:, cols].T / 2.0) @ v[:, cols])
        expected[n] = torch.cat(heads, -1) @ attention.out_proj.weight.double().T + attention.out_proj.bias.double()
    torch.testing.assert_close(output.double(), expected, atol=1e-6, rtol=1e-5)
    assert weights.shape == (2, 3, 4, 6) and weights[1, ..., 3:].abs().max() == 0


def test_sinusoidal_position_encoding_follows_section_3_5():
    table = sinusoidal_position_encoding(50, 6)
    for pos in (0, 1, 17, 49):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_embeddings_are_scaled_by_sqrt_d_model_and_positions_added():
    model = tiny_model(preset="small", scale_embedding=True)
    ids = torch.tensor([[5, 6, 7]])
    encoder = model.get_encoder()
    expected = encoder.embed_tokens.weight[ids] * 4.0 + sinusoidal_position_encoding(64, 16)[:3]
    first_layer_input = model.model.encoder(ids, output_hidden_states=True).hidden_states[0]
    torch.testing.assert_close(first_layer_input, expected)


def test_scale_norm_projects_onto_the_sphere_of_radius_g():
    # Nguyen & Salazar 2019, eq. 6: g * x / ||x||. (3, 4) has length 5; g = 2 -> (1.2, 1.6).
    norm = modeling_transformer_seq2seq.ScaleNorm(2)
    assert norm.weight.item() == pytest.approx(math.sqrt(2))  # g starts at sqrt(d_model)
    with torch.no_grad():
        norm.weight.fill_(2.0)
    out = norm(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    torch.testing.assert_close(out, torch.tensor([[1.2, 1.6], [0.0, 0.0]]))  # a zero vector stays 0, no NaN
    model = tiny_model(preset="small", norm_type="scale_norm")
    norms = [m for m in model.modules() if isinstance(m, modeling_transformer_seq2seq.ScaleNorm)]
    assert len(norms) == 2 * 2 + 2 * 3 and not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    assert all(m.weight.item() == pytest.approx(4.0) for m in norms)  # sqrt(16), also after _init_weights


def test_fix_norm_gives_unit_length_input_embeddings_and_cosine_logits():
    # FixNorm (Nguyen & Chiang 2018): logits_w = |h| cos(h, e_w), inputs sqrt(d_model) e_w / |e_w|.
    model = tiny_model(preset="small", norm_order="pre", norm_type="scale_norm", fix_norm=True)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_hidden_states=True,
    )
    h = model.model.decoder(
        decoder_input_ids, encoder_hidden_states=out.encoder_last_hidden_state, encoder_attention_mask=attention_mask
    ).last_hidden_state.double()
    e = model.lm_head.weight.double()
    cosine = (h @ e.T) / (h.norm(dim=-1, keepdim=True) * e.norm(dim=-1).clamp_min(1e-12))  # the padding row is 0
    torch.testing.assert_close(out.logits.double(), h.norm(dim=-1, keepdim=True) * cosine, rtol=1e-5, atol=1e-5)
    # The final ScaleNorm makes |h| = g, so every logit lies in [-g, g].
    g = model.model.decoder.layer_norm.weight.item()
    torch.testing.assert_close(h.norm(dim=-1), torch.full(h.shape[:2], g, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    embedded = out.encoder_hidden_states[0] - sinusoidal_position_encoding(64, 16)[: input_ids.size(1)]
    torch.testing.assert_close(
        embedded.norm(dim=-1)[input_ids != PAD], torch.full(((input_ids != PAD).sum().item(),), 4.0)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_fix_norm_leaves_the_zero_padding_row_without_gradient_and_finite_in_half_precision(dtype):
    # Dividing the zero padding embedding by its (clamped) length would send ~1e12 x its gradient
    # into it, and in float16 a clamp of 1e-12 rounds to 0 (0/0 = NaN).
    torch.manual_seed(0)
    model = tiny_model(preset="small", norm_order="pre", norm_type="scale_norm", fix_norm=True).train().to(dtype)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = torch.randint(4, 37, decoder_input_ids.shape)
    loss = model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, labels=labels
    ).loss
    loss.backward()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    assert torch.isfinite(loss) and torch.isfinite(grads).all()
    assert model.lm_head.weight.grad[PAD].abs().max().item() == 0.0
    assert grads.norm().item() < 100  # the same order as without FixNorm, not ~1e10


def test_fix_norm_unit_rows_keep_float64():
    """unit_rows took the length in float32 for every dtype, which torch refuses for float64."""
    from attention_seq2seq.modeling.modeling_transformer_seq2seq import unit_rows

    weight = torch.tensor([[3.0, 4.0], [0.0, 0.0]], dtype=torch.float64)
    assert unit_rows(weight).dtype == torch.float64
    assert unit_rows(weight).tolist() == [[0.6, 0.8], [0.0, 0.0]]


def test_scale_norm_and_fix_norm_survive_save_and_load(tmp_path):
    from transformers import AutoModelForSeq2SeqLM

    model = tiny_model(preset="small", norm_order="pre", norm_type="scale_norm", fix_norm=True)
    with torch.no_grad():  # trained gains, so a re-initialisation on load would show
        for i, m in enumerate(m for m in model.modules() if isinstance(m, modeling_transformer_seq2seq.ScaleNorm)):
            m.weight.fill_(1.5 + i)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert (loaded.config.norm_type, loaded.config.fix_norm) == ("scale_norm", True)
    new_logits = loaded(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(new_logits, logits, rtol=0, atol=0)


# --------------------------------------------------------------------------------------------
# Whole-model behaviour
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoder_is_causal(variant):
    model = tiny_model(preset="small", **variant)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    t = 3
    changed = decoder_input_ids.clone()
    changed[:, t] = (changed[:, t] + 1 - 4) % 33 + 4
    new_logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(new_logits[:, :t], logits[:, :t], rtol=0, atol=0)
    assert (new_logits[:, t:] - logits[:, t:]).abs().amax(dim=-1).min() > 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
def test_padded_source_tokens_change_nothing(variant):
    model = tiny_model(preset="small", **variant)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    garbage = input_ids.clone()
    garbage[1, 4:] = torch.tensor([9, 10, 11])  # only padded positions of sentence 1 change
    out2 = model(input_ids=garbage, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(out2.logits, out.logits, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        out2.encoder_last_hidden_state[1, :4], out.encoder_last_hidden_state[1, :4], rtol=0, atol=1e-6
    )
    # The same change without the mask does change the output: the test can fail.
    unmasked = model(input_ids=garbage, decoder_input_ids=decoder_input_ids).logits
    assert (unmasked[1] - out.logits[1]).abs().max() > 1e-4


@pytest.mark.parametrize("variant", VARIANTS)
def test_eager_and_sdpa_agree(variant):
    model = tiny_model(preset="small", **variant)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = decoder_input_ids.roll(-1, dims=1)
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    sdpa = model(**kwargs, labels=labels)
    sdpa.loss.backward()
    sdpa_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_attn_implementation("eager")
    eager = model(**kwargs, labels=labels)
    eager.loss.backward()
    torch.testing.assert_close(eager.logits, sdpa.logits, rtol=0, atol=1e-5)
    for grad, sdpa_grad in zip((p.grad for p in model.parameters()), sdpa_grads):
        torch.testing.assert_close(grad, sdpa_grad, rtol=1e-4, atol=1e-5)


def test_attention_weights_under_sdpa_are_eager_weights_with_one_warning(monkeypatch):
    """SDPA never materialises the probabilities: output_attentions=True computes them with the eager
    attention (transformers' models warn and return none), the logits unchanged."""
    from attention_seq2seq.modeling import modeling_transformer_seq2seq

    warnings = []
    monkeypatch.setattr(modeling_transformer_seq2seq.logger, "warning_once", warnings.append)
    sdpa, eager = (
        tiny_model(preset="small", attn_implementation="sdpa"),
        tiny_model(preset="small", attn_implementation="eager"),
    )
    eager.load_state_dict(sdpa.state_dict())
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    got = sdpa(**kwargs, output_attentions=True)
    want = eager(**kwargs, output_attentions=True)
    assert warnings and all("eager attention" in w and "'sdpa'" in w for w in warnings)
    for name in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        assert len(getattr(got, name)) == len(getattr(want, name)) > 0
        for a, b in zip(getattr(got, name), getattr(want, name)):
            torch.testing.assert_close(a, b)
    torch.testing.assert_close(got.logits, sdpa(**kwargs).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_incremental_decoding_with_cache_equals_teacher_forcing(variant):
    model = tiny_model(preset="small", **variant)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits

    # Two positions at once first (a multi-token step into an empty cache), then one at a time.
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :2])
    cache, encoder_outputs, steps = out.cache, (out.encoder_last_hidden_state,), [out.logits]
    cross_keys = cache.cross_attention_cache.layers[0].keys
    for t in range(2, decoder_input_ids.size(1)):
        out = model(
            attention_mask=attention_mask,
            encoder_outputs=encoder_outputs,
            decoder_input_ids=decoder_input_ids[:, t : t + 1],
            cache=cache,
        )
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)
    assert cache.get_seq_length() == decoder_input_ids.size(1)
    # Cross-attention keys were projected once per source, then reused: the same tensor object.
    assert cache.cross_attention_cache.layers[0].keys is cross_keys


def test_multi_token_step_after_cached_positions_is_causal():
    """A chunk of several new positions after cached ones (e.g. assisted decoding) needs the
    bottom-right aligned causal mask."""
    model = tiny_model(preset="small")
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    first = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :2])
    rest = model(
        attention_mask=attention_mask,
        encoder_outputs=(first.encoder_last_hidden_state,),
        decoder_input_ids=decoder_input_ids[:, 2:],
        cache=first.cache,
    )
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), full, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_batch_equals_each_sentence_alone(variant):
    model = tiny_model(preset="small", **variant)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = decoder_input_ids.roll(-1, 1)
    labels[1, 3:] = -100  # the second target is shorter: padded as the collator does
    decoder_input_ids = shift_tokens_right(labels, PAD, BOS)
    batch = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    for n, (src_len, tgt_len) in enumerate([(7, 6), (4, 3)]):
        alone = model(
            input_ids=input_ids[n : n + 1, :src_len], decoder_input_ids=decoder_input_ids[n : n + 1, :tgt_len]
        )
        torch.testing.assert_close(batch[n : n + 1, :tgt_len], alone.logits, rtol=0, atol=1e-5)

    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=6)
    for n, src_len in enumerate([7, 4]):
        alone = model.generate(input_ids=input_ids[n : n + 1, :src_len], num_beams=1, max_new_tokens=6)
        assert generated[n, : alone.size(1)].tolist() == alone[0].tolist()


def _greedy_by_hand(model, input_ids, attention_mask, steps):
    """Argmax decoding by repeated full forward passes: no cache, no generate()."""
    decoded = torch.full((input_ids.size(0), 1), BOS)
    finished = torch.zeros(input_ids.size(0), dtype=torch.bool)
    for _ in range(steps):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoded).logits
        next_ids = logits[:, -1].argmax(-1).masked_fill(finished, PAD)
        decoded = torch.cat([decoded, next_ids[:, None]], dim=1)
        finished |= next_ids == EOS
        if finished.all():
            break
    return decoded


def test_generate_greedy_and_one_beam_equal_argmax_decoding_by_hand():
    model = tiny_model(preset="small", eos_token_id=EOS)
    with torch.no_grad():  # make </s> likely after a few steps so that stopping is exercised too
        model.lm_head.weight[EOS] *= 3.0
    input_ids, attention_mask, _ = padded_batch()
    by_hand = _greedy_by_hand(model, input_ids, attention_mask, steps=8)
    greedy = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=8)
    one_beam = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, num_beams=1, do_sample=False, max_new_tokens=8
    )
    no_cache = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, num_beams=1, max_new_tokens=8, use_cache=False
    )
    assert greedy.tolist() == by_hand.tolist() == one_beam.tolist() == no_cache.tolist()
    top1_sampling = model.generate(
        input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=1, num_beams=1, max_new_tokens=8
    )
    assert top1_sampling.tolist() == greedy.tolist()


@pytest.mark.parametrize("norm_order", ["post", "pre"])
def test_beam_search_with_and_without_cache_agree(norm_order):
    model = tiny_model(preset="small", norm_order=norm_order)
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, num_beams=4, max_new_tokens=8)
    with_cache = model.generate(**kwargs, use_cache=True, output_scores=True, return_dict_in_generate=True)
    without = model.generate(**kwargs, use_cache=False, output_scores=True, return_dict_in_generate=True)
    assert with_cache.sequences.tolist() == without.sequences.tolist()
    torch.testing.assert_close(with_cache.sequences_scores, without.sequences_scores, rtol=1e-5, atol=1e-5)


def test_generation_defaults_live_in_generation_config():
    model = tiny_model(preset="small")
    generation_config = model.generation_config
    assert (generation_config.num_beams, generation_config.max_new_tokens) == (5, 128)
    assert (generation_config.decoder_start_token_id, generation_config.eos_token_id) == (BOS, EOS)
    assert generation_config.pad_token_id == PAD
    input_ids, attention_mask, _ = padded_batch()
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3)
    assert out[:, 0].tolist() == [BOS, BOS]


def test_an_explicit_max_length_beats_the_default_max_new_tokens():
    """generate(max_length=N) stops at N decoder tokens; before, the model's max_new_tokens=128 won
    (129 tokens). </s> is suppressed so that only the length limit can stop decoding."""
    model = tiny_model(preset="small")
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, suppress_tokens=[EOS])
    assert model.generate(**kwargs, max_length=10).shape == (2, 10)
    assert model.generate(**kwargs, max_length=10, num_beams=1).shape == (2, 10)
    from transformers import GenerationConfig

    assert model.generate(**kwargs, generation_config=GenerationConfig(max_length=6)).shape == (2, 6)
    assert model.generate(**kwargs, max_new_tokens=4).shape == (2, 5)  # max_new_tokens still counts new tokens
    assert model.generation_config.max_new_tokens == 128  # the model's default is untouched


def test_default_generation_length_is_capped_at_max_position_embeddings():
    """With max_position_embeddings=8 the default (128 new tokens) stops at 8 decoder tokens instead
    of failing at the step past the position table; an explicit longer request is refused before
    decoding, naming both numbers (8 + 1 tokens still decode: the last token is never fed back)."""
    model = tiny_model(preset="small", max_position_embeddings=8)
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, suppress_tokens=[EOS])
    for num_beams in (1, 3):
        assert model.generate(**kwargs, num_beams=num_beams).shape == (2, 8)
    assert model.generate(**kwargs, max_new_tokens=8, num_beams=1).shape == (2, 9)
    with pytest.raises(ValueError, match=r"up to 21 decoder tokens \(max_new_tokens=20.*max_position_embeddings=8"):
        model.generate(**kwargs, max_new_tokens=20)
    with pytest.raises(ValueError, match=r"up to 12 decoder tokens \(max_length=12\).*max_position_embeddings=8"):
        model.generate(**kwargs, max_length=12)


def test_sampling_is_reproducible_under_a_seed():
    model = tiny_model(preset="small")
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, num_beams=1, max_new_tokens=10)
    torch.manual_seed(3)
    first = model.generate(**kwargs)
    torch.manual_seed(3)
    assert model.generate(**kwargs).tolist() == first.tolist()


@pytest.mark.parametrize(
    "share, tie", [(True, True), (True, False), (False, True), (False, False)], ids=lambda v: str(v)
)
def test_save_and_load_give_identical_logits_and_keep_tying(tmp_path, share, tie):
    model = tiny_model(
        preset="small",
        share_encoder_decoder_embeddings=share,
        tie_word_embeddings=tie,
        position_embedding_type="learned",
    )
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    model.save_pretrained(tmp_path)

    from transformers import AutoModelForSeq2SeqLM

    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is TransformerSeq2SeqForConditionalGeneration
    new_logits = loaded(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(new_logits, logits, rtol=0, atol=0)
    encoder_embed, decoder_embed = loaded.model.encoder.embed_tokens, loaded.model.decoder.embed_tokens
    assert (encoder_embed is decoder_embed) == share
    assert (loaded.lm_head.weight is decoder_embed.weight) == tie
    assert loaded.generation_config.num_beams == 5


def test_sinusoidal_table_is_not_saved_and_is_rebuilt_on_load(tmp_path):
    model = tiny_model(preset="small", position_embedding_type="sinusoidal")
    assert not any("embed_positions" in name for name in model.state_dict())
    model.save_pretrained(tmp_path)
    loaded = TransformerSeq2SeqForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager")
    torch.testing.assert_close(loaded.model.decoder.embed_positions.weight, sinusoidal_position_encoding(64, 16))
    # the remedy the sdpa error message gives works
    out = loaded(input_ids=torch.tensor([[5, EOS]]), decoder_input_ids=torch.tensor([[BOS]]), output_attentions=True)
    assert out.cross_attentions[0].shape == (1, 4, 1, 2)


def test_base_model_returns_decoder_states():
    config = tiny_model_config(preset="small")
    model = TransformerSeq2SeqModel(config).eval()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    assert out.last_hidden_state.shape == (2, 6, 16)
    assert torch.isfinite(out.last_hidden_state).all()


def test_labels_alone_build_shifted_decoder_inputs_and_loss_is_label_smoothed_mean():
    model = tiny_model(preset="small", label_smoothing=0.1)
    input_ids, attention_mask, _ = padded_batch()
    labels = torch.randint(4, 37, (2, 5))
    labels[1, 3:] = -100
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    decoder_input_ids = torch.cat([torch.full((2, 1), BOS), labels[:, :-1].clamp(min=0)], dim=1)
    explicit = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(out.logits, explicit.logits, rtol=0, atol=0)

    log_probs = explicit.logits.double().log_softmax(-1)
    keep = labels != -100
    nll = -log_probs[keep].gather(-1, labels[keep][:, None]).squeeze(-1)
    uniform = -log_probs[keep].mean(-1)
    expected = (0.9 * nll + 0.1 * uniform).mean()
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_a_source_row_without_real_tokens_is_refused_naming_the_row(attn_implementation):
    """Same error as the RNN's; before, the row was translated silently (eager spread its attention
    uniformly over the padding)."""
    model = tiny_model(preset="small", attn_implementation=attn_implementation)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    attention_mask[1] = 0
    message = r"attention_mask row\(s\) \[1\] are all 0: every source sentence needs at least one real token"
    for training in (False, True):
        model.train(training)
        with pytest.raises(ValueError, match=message):
            model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    model.eval()
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3)


def test_exceeding_max_position_embeddings_raises_clearly():
    model = tiny_model(preset="small", max_position_embeddings=8)
    with pytest.raises(ValueError, match="longer than max_position_embeddings=8"):
        model(input_ids=torch.randint(4, 37, (1, 9)), decoder_input_ids=torch.tensor([[BOS]]))
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model.generate(input_ids=torch.randint(4, 37, (1, 5)), num_beams=1, max_new_tokens=20, eos_token_id=None)


@pytest.mark.parametrize("norm_order", ["post", "pre"])
def test_gradient_checkpointing_gives_the_same_gradients(norm_order):
    model = tiny_model(preset="small", norm_order=norm_order).train()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = decoder_input_ids.roll(-1, 1)

    def gradients():
        model.zero_grad()
        model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    calls = []
    model.model.decoder.layers[0].feed_forward.register_forward_pre_hook(lambda *args: calls.append(1))
    plain = gradients()
    assert len(calls) == 1
    model.activation_checkpointing_enable()
    checkpointed = gradients()
    assert len(calls) == 3  # the checkpointed layer ran again during backward
    for name, grad in plain.items():
        torch.testing.assert_close(checkpointed[name], grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
def test_cpu_mixed_precision_trains_attention_in_float32_and_matches_float32_training(monkeypatch, kernel):
    """Under CPU bf16 autocast the projections run in bf16 but the attention gets float32 inputs
    while training (SDPA's bf16 backward is ~5x slower on CPU), through SDPA (longer sentences)
    or plain matmuls (short ones, _TRAIN_STEP_MAX_KEYS); inference keeps the bf16 SDPA kernel."""
    torch.manual_seed(0)
    model = tiny_model(preset="small").train()
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    labels = decoder_input_ids.roll(-1, 1)
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, *args, **kwargs):
        seen.append((query.dtype, key.dtype, value.dtype))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    if kernel == "sdpa":
        monkeypatch.setattr(cpu_fast_paths, "_TRAIN_STEP_MAX_KEYS", 0)
    else:
        plain = modeling_transformer_seq2seq.eager_attention_forward

        def matmul_spy(module, query, key, value, *args, **kwargs):
            seen.append((query.dtype, key.dtype, value.dtype))
            return plain(module, query, key, value, *args, **kwargs)

        monkeypatch.setattr(modeling_transformer_seq2seq, "eager_attention_forward", matmul_spy)

    def loss_and_gradients(mixed: bool):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    reference_loss, reference_grad = loss_and_gradients(mixed=False)
    seen.clear()
    mixed_loss, mixed_grad = loss_and_gradients(mixed=True)
    assert len(seen) == 2 + 2 * 2  # encoder self, decoder self + cross, 2 layers each
    assert set(seen) == {(torch.float32,) * 3}
    assert mixed_loss.dtype == torch.float32
    assert abs(mixed_loss.item() - reference_loss.item()) < 0.02 * reference_loss.item()
    assert torch.nn.functional.cosine_similarity(mixed_grad, reference_grad, dim=0) > 0.99

    seen.clear()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.eval()(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    assert len(seen) == 6 and set(seen) == {(torch.bfloat16,) * 3}


def test_output_attentions_and_hidden_states_layouts():
    model = tiny_model(preset="small", attn_implementation="eager", encoder_layers=3, decoder_layers=2)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_attentions=True,
        output_hidden_states=True,
    )
    assert [a.shape for a in out.encoder_attentions] == [(2, 4, 7, 7)] * 3
    assert [a.shape for a in out.decoder_attentions] == [(2, 4, 6, 6)] * 2
    assert [a.shape for a in out.cross_attentions] == [(2, 4, 6, 7)] * 2
    assert len(out.encoder_hidden_states) == 4 and len(out.decoder_hidden_states) == 3
    torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)
    for weights in out.encoder_attentions + out.cross_attentions:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        assert weights[1, ..., 4:].abs().max() == 0  # no weight on the second source's padding
    for weights in out.decoder_attentions:
        assert torch.triu(weights, diagonal=1).abs().max() == 0  # no weight on future positions

    # During generation the cross-attention of each step covers the whole source.
    gen = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=1,
        max_new_tokens=3,
        output_attentions=True,
        return_dict_in_generate=True,
    )
    assert [layer.shape for layer in gen.cross_attentions[1]] == [(2, 4, 1, 7)] * 2


def test_auto_classes_are_registered():
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    values = tiny_model_config(preset="small").to_dict()
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    assert type(AutoModel.from_config(config)) is TransformerSeq2SeqModel
    assert type(AutoModelForSeq2SeqLM.from_config(config)) is TransformerSeq2SeqForConditionalGeneration


def _word_vocab(pairs):
    words = sorted({w for src, tgt in pairs for w in (src + " " + tgt).split()})
    return {w: i + 4 for i, w in enumerate(words)}  # 0-3: <pad>, <s>, </s>, <unk>


def _encode(sentences, vocab, pad_value):
    ids = [[vocab.get(w, UNK) for w in s.split()] + [EOS] for s in sentences]
    width = max(map(len, ids))
    return torch.tensor([row + [pad_value] * (width - len(row)) for row in ids])


@pytest.mark.parametrize("norm_order", ["post", "pre"])
def test_overfits_twenty_training_pairs(norm_order):
    pairs = read_pairs(20)
    vocab = _word_vocab(pairs)
    input_ids = _encode([de for de, _ in pairs], vocab, PAD)
    labels = _encode([en for _, en in pairs], vocab, -100)
    model = tiny_model(
        preset="small",
        vocab_size=len(vocab) + 4,
        d_model=64,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        norm_order=norm_order,
    ).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        loss = model(input_ids=input_ids, attention_mask=(input_ids != PAD).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.05:
            break
    assert loss.item() < 0.1
    # and it has learned the translations: greedy decoding reproduces the training targets
    model.eval()
    generated = model.generate(
        input_ids=input_ids[:4], attention_mask=(input_ids[:4] != PAD).long(), num_beams=1, max_new_tokens=40
    )
    for n in range(4):
        target = labels[n][labels[n] != -100].tolist()
        assert generated[n, 1 : 1 + len(target)].tolist() == target


@pytest.mark.parametrize("share", [True, False])
def test_resizing_the_vocabulary_resizes_every_embedding_and_keeps_tying(share):
    model = tiny_model(preset="small", share_encoder_decoder_embeddings=share)
    model.resize_token_embeddings(45, mean_resizing=False)
    assert model.config.vocab_size == 45
    assert model.model.encoder.embed_tokens.weight.shape == model.model.decoder.embed_tokens.weight.shape == (45, 16)
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
    logits = model(input_ids=torch.tensor([[44, EOS]]), decoder_input_ids=torch.tensor([[BOS, 44]])).logits
    assert logits.shape == (1, 2, 45)


def test_training_forward_builds_no_cache_and_tuples_on_request():
    model = tiny_model(preset="small")
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    assert model(**kwargs).cache is not None  # eval: ready for the next decoding step
    model.train()
    assert model(**kwargs).cache is None  # training: no keys/values kept for a step that never comes
    model.eval()
    as_tuple = model(**kwargs, use_cache=False, return_dict=False)
    torch.testing.assert_close(as_tuple[0], model(**kwargs).logits)


def test_missing_inputs_raise():
    model = tiny_model(preset="small")
    with pytest.raises(ValueError, match="decoder_input_ids"):
        model(input_ids=torch.tensor([[5, EOS]]))
    with pytest.raises(ValueError, match="input_ids or encoder_outputs"):
        model(decoder_input_ids=torch.tensor([[BOS]]))


def test_initialisation_gives_each_projection_block_its_own_xavier_scale():
    model = tiny_model(preset="small", d_model=64, vocab_size=500, encoder_ffn_dim=256)
    attention = model.model.encoder.layers[0].self_attn
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):  # Xavier for 64 × 64 each
        assert projection.weight.std().item() == pytest.approx(64**-0.5, rel=0.1)
        assert projection.bias.abs().max() == 0
    cross_attention = model.model.decoder.layers[0].encoder_attn
    for block in (cross_attention.q_proj.weight, cross_attention.k_proj.weight, cross_attention.v_proj.weight):
        assert block.std().item() == pytest.approx(64**-0.5, rel=0.1)
    fc1 = model.model.encoder.layers[0].feed_forward.fc1.weight
    assert fc1.std().item() == pytest.approx(math.sqrt(2 / (64 + 256)), rel=0.1)
    embeddings = model.model.shared.weight
    assert embeddings.std().item() == pytest.approx(64**-0.5, rel=0.1)  # unit variance after ×√d_model
    assert embeddings[PAD].abs().max() == 0


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_decoder_attention_mask_on_right_padding_changes_no_real_position(attn_implementation):
    """The explicit (padding & causal) mask path agrees with the mask-free causal path."""
    model = tiny_model(preset="small", attn_implementation=attn_implementation)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    decoder_attention_mask = torch.ones_like(decoder_input_ids)
    decoder_attention_mask[1, 4:] = 0
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    plain = model(**kwargs).logits
    masked = model(**kwargs, decoder_attention_mask=decoder_attention_mask).logits
    torch.testing.assert_close(masked[0], plain[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(masked[1, :4], plain[1, :4], rtol=0, atol=1e-5)
    # Masking a real key does reach the later queries: the mask is applied.
    decoder_attention_mask[0, 2] = 0
    hidden_key = model(**kwargs, decoder_attention_mask=decoder_attention_mask).logits
    torch.testing.assert_close(hidden_key[0, :2], plain[0, :2], rtol=0, atol=1e-5)
    assert (hidden_key[0, 3:] - plain[0, 3:]).abs().max() > 1e-4


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_one_source_serves_several_consecutive_decoder_rows(attn_implementation):
    """Decoder batch = k × source batch (how generate() runs beams) equals repeating each source k times."""
    model = tiny_model(preset="small", attn_implementation=attn_implementation)
    input_ids, attention_mask, decoder_input_ids = padded_batch()
    decoder_input_ids = torch.cat([decoder_input_ids, decoder_input_ids.flip(1)])[[0, 2, 1, 3]]  # 2 rows per source
    weights = attn_implementation == "eager"
    shared = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        output_attentions=weights,
    )
    repeated = model(
        input_ids=input_ids.repeat_interleave(2, 0),
        attention_mask=attention_mask.repeat_interleave(2, 0),
        decoder_input_ids=decoder_input_ids,
        output_attentions=weights,
    )
    torch.testing.assert_close(shared.logits, repeated.logits, rtol=0, atol=1e-5)
    assert shared.cache.cross_attention_cache.layers[0].keys.size(0) == 2  # one copy per source
    if weights:
        for mine, reference in zip(shared.cross_attentions, repeated.cross_attentions):
            torch.testing.assert_close(mine, reference, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="split evenly"):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:3])


def test_beam_search_keeps_one_encoder_copy_per_source_and_matches_the_repeated_reference():
    from transformers import GenerationMixin

    model = tiny_model(preset="small", attn_implementation="eager")
    input_ids, attention_mask, _ = padded_batch()
    kwargs = dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        num_beams=3,
        num_return_sequences=2,
        max_new_tokens=8,
        output_scores=True,
        output_attentions=True,
        return_dict_in_generate=True,
    )
    ours = model.generate(**kwargs)
    assert ours.cache.cross_attention_cache.layers[0].keys.size(0) == 2  # not 2 × 3 beams
    assert [a.shape for a in ours.cross_attentions[1]] == [(6, 4, 1, 7)] * 2  # per beam, as usual

    # transformers' own expansion (the encoder output repeated per beam, as for Marian/BART)
    model._expand_inputs_for_generation = GenerationMixin._expand_inputs_for_generation.__get__(model)
    reference = model.generate(**kwargs)
    assert reference.cache.cross_attention_cache.layers[0].keys.size(0) == 6
    assert ours.sequences.tolist() == reference.sequences.tolist()
    torch.testing.assert_close(ours.sequences_scores, reference.sequences_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block_rows", [None, 2])  # one block; blocks of 2 rows, the last one short
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_label_smoothed_cross_entropy_matches_torch_in_value_and_gradient(epsilon, block_rows, monkeypatch):
    if block_rows is not None:  # the CPU's cache-sized blocks, shrunk to 2 rows of 13 float32s
        monkeypatch.setattr(cpu_fast_paths, "_LOSS_BLOCK_BYTES", block_rows * 13 * 4)
        assert cpu_fast_paths._loss_block_rows(torch.empty(9, 13)) == block_rows
    logits = torch.randn(9, 13, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 13, (9,))
    labels[[2, 5]] = -100
    loss = label_smoothed_cross_entropy(logits, labels, epsilon)
    (grad,) = torch.autograd.grad(2.5 * loss, logits)
    reference = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=epsilon)
    (reference_grad,) = torch.autograd.grad(2.5 * reference, logits)
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, reference_grad, rtol=1e-12, atol=1e-12)
    assert grad[[2, 5]].abs().max() == 0  # ignored positions get no gradient
    assert torch.autograd.gradcheck(lambda x: label_smoothed_cross_entropy(x, labels, epsilon), (logits,))
    summed = label_smoothed_cross_entropy(logits, labels, epsilon, reduction="sum")
    (summed_grad,) = torch.autograd.grad(summed, logits)
    reference = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=epsilon, reduction="sum")
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(summed, reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(summed_grad, reference_grad, rtol=1e-12, atol=1e-12)


def test_label_smoothed_cross_entropy_blocks_give_the_one_block_numbers_for_bf16_logits(monkeypatch):
    """The CPU loops over blocks of rows (`_loss_block_rows`): bf16 logits of 37 tokens in blocks of
    8 rows give the very loss and gradient of one block, and the gradient stays bf16."""
    torch.manual_seed(0)
    logits = (3 * torch.randn(37, 50)).bfloat16().requires_grad_()
    labels = torch.randint(0, 50, (37,))
    labels[[0, 9, 36]] = -100
    results = []
    for block_bytes in (1 << 40, 8 * 50 * 4):
        monkeypatch.setattr(cpu_fast_paths, "_LOSS_BLOCK_BYTES", block_bytes)
        loss = label_smoothed_cross_entropy(logits, labels, 0.1)
        (grad,) = torch.autograd.grad(loss, logits)
        results.append((loss, grad))
    assert cpu_fast_paths._loss_block_rows(logits) == 8
    (loss_one, grad_one), (loss_blocks, grad_blocks) = results
    assert grad_blocks.dtype == torch.bfloat16 and loss_blocks.dtype == torch.float32
    assert torch.equal(loss_one, loss_blocks) and torch.equal(grad_one, grad_blocks)
    reference = torch.nn.functional.cross_entropy(logits.float(), labels, label_smoothing=0.1)
    torch.testing.assert_close(loss_blocks, reference)


def test_label_smoothed_cross_entropy_is_zero_when_every_label_is_ignored():
    logits = torch.randn(3, 5, requires_grad=True)
    loss = label_smoothed_cross_entropy(logits, torch.full((3,), -100), 0.1)
    loss.backward()
    assert loss.item() == 0.0 and logits.grad.abs().max() == 0
