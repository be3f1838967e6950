"""Attention of the RNN encoder-decoder (modeling/rnn_attention.py): every score, the softmax,
the context, h̃_t, the local windows (p_t, Gaussian) and hard attention against float64
computations written out element by element."""

from __future__ import annotations

import math

import pytest
import torch

from attention_seq2seq import RNNSeq2SeqConfig
from attention_seq2seq.modeling.rnn_attention import (
    BahdanauAttention,
    LuongAttention,
    StraightThroughArgmax,
    additive_score,
    luong_attentional_state,
    masked_softmax,
    maxout,
)

BATCH, TGT_LEN, SRC_LEN, HIDDEN = 2, 3, 5, 4
# Sentence 0 has 5 real source tokens, sentence 1 has 3 (two padding positions).
SOURCE_LENGTHS = [5, 3]


def _config(**kwargs) -> RNNSeq2SeqConfig:
    return RNNSeq2SeqConfig(vocab_size=10, embedding_size=HIDDEN, hidden_size=HIDDEN, **kwargs)


def _module(attention: str, seed: int = 0, **kwargs):
    config = _config(attention=attention, **kwargs)
    module = (BahdanauAttention if attention == "bahdanau" else LuongAttention)(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.rand(param.shape, generator=generator) * 2 - 1)
    return module.double()


def _inputs(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(BATCH, TGT_LEN, HIDDEN, generator=generator, dtype=torch.float64)
    values = torch.randn(BATCH, SRC_LEN, HIDDEN, generator=generator, dtype=torch.float64)
    mask = torch.zeros(BATCH, SRC_LEN, dtype=torch.bool)
    for b, length in enumerate(SOURCE_LENGTHS):
        mask[b, :length] = True
        values[b, length:] = 0.0  # the encoder's padded outputs are zero
    coverage = torch.rand(BATCH, SRC_LEN, generator=generator, dtype=torch.float64) * mask
    return query, values, mask, coverage


def _softmax(row: list[float]) -> list[float]:
    exps = [math.exp(x) for x in row]
    return [e / sum(exps) for e in exps]


def _tanh_vec(xs):
    return [math.tanh(x) for x in xs]


def _matvec(weight: torch.Tensor, x: list[float]) -> list[float]:
    return [sum(weight[i, j].item() * x[j] for j in range(len(x))) for i in range(weight.shape[0])]


def _dot(a, b) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _hand_score(module, query, values, coverage, b, t, s) -> float:
    """score(h_t, h̄_s) written out from the paper's formula with the module's weights."""
    h_t, h_s = query[b, t].tolist(), values[b, s].tolist()
    if isinstance(module, BahdanauAttention) or module.score_name == "concat":
        w_s = _matvec(module.q_proj.weight, h_t)
        u_h = [
            u + bias for u, bias in zip(_matvec(module.k_proj.weight, h_s), module.k_proj.bias.tolist(), strict=True)
        ]
        feats = [a + c for a, c in zip(w_s, u_h, strict=True)]
        if getattr(module, "coverage_proj", None) is not None:
            feats = [
                f + w * coverage[b, s].item()
                for f, w in zip(feats, module.coverage_proj.weight[:, 0].tolist(), strict=True)
            ]
        return _dot(module.v.tolist(), _tanh_vec(feats))
    if module.score_name == "dot":
        return _dot(h_t, h_s)
    if module.score_name == "general":
        return _dot(h_t, _matvec(module.k_proj.weight, h_s))
    if module.score_name == "scaled_dot":
        return _dot(h_t, h_s) / math.sqrt(HIDDEN)
    if module.score_name == "cosine":
        norm = math.sqrt(_dot(h_t, h_t)) * math.sqrt(_dot(h_s, h_s))
        beta = math.log1p(math.exp(_dot(module.key_strength.weight[0].tolist(), h_t) + module.key_strength.bias.item()))
        return beta * _dot(h_t, h_s) / norm
    raise AssertionError(module.score_name)


SCORE_CASES = [
    ("bahdanau", {}),
    ("bahdanau", {"coverage": True}),
    ("luong", {"score": "dot"}),
    ("luong", {"score": "general"}),
    ("luong", {"score": "concat"}),
    ("luong", {"score": "concat", "coverage": True}),
    ("luong", {"score": "cosine"}),
    ("luong", {"score": "scaled_dot"}),
]


@pytest.mark.parametrize(("attention", "kwargs"), SCORE_CASES, ids=lambda x: str(x))
def test_scores_softmax_and_context_match_hand_computation(attention, kwargs):
    module = _module(attention, **kwargs)
    query, values, mask, coverage = _inputs()
    keys = module.precompute_keys(values)
    positions = torch.arange(TGT_LEN)
    context, weights = module(query, keys, values, mask, positions, coverage if module_has_coverage(module) else None)
    scores = module.score(query, keys, coverage if module_has_coverage(module) else None)

    for b, length in enumerate(SOURCE_LENGTHS):
        for t in range(TGT_LEN):
            expected_scores = [_hand_score(module, query, values, coverage, b, t, s) for s in range(length)]
            torch.testing.assert_close(scores[b, t, :length], torch.tensor(expected_scores, dtype=torch.float64))
            expected_weights = _softmax(expected_scores) + [0.0] * (SRC_LEN - length)
            torch.testing.assert_close(weights[b, t], torch.tensor(expected_weights, dtype=torch.float64))
            assert (weights[b, t, length:] == 0).all()  # exactly zero on padding
            expected_context = [
                sum(expected_weights[s] * values[b, s, d].item() for s in range(SRC_LEN)) for d in range(HIDDEN)
            ]
            torch.testing.assert_close(context[b, t], torch.tensor(expected_context, dtype=torch.float64))


def module_has_coverage(module) -> bool:
    return getattr(module, "coverage_proj", None) is not None


def test_additive_score_function_matches_loops():
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, 3, 4, generator=generator, dtype=torch.float64)
    k = torch.randn(2, 5, 4, generator=generator, dtype=torch.float64)
    v = torch.randn(4, generator=generator, dtype=torch.float64)
    out = additive_score(q, k, v)
    for b in range(2):
        for t in range(3):
            for s in range(5):
                expected = sum(v[a].item() * math.tanh(q[b, t, a].item() + k[b, s, a].item()) for a in range(4))
                assert out[b, t, s].item() == pytest.approx(expected, abs=1e-12)


def test_masked_softmax_is_exactly_zero_outside_mask_even_for_huge_scores():
    scores = torch.tensor([[[1e30, 2.0, 3.0, -1e30]]], dtype=torch.float64)
    mask = torch.tensor([[[False, True, True, False]]])
    weights = masked_softmax(scores, mask)
    assert weights[0, 0, 0] == 0 and weights[0, 0, 3] == 0
    expected = _softmax([2.0, 3.0])
    torch.testing.assert_close(weights[0, 0, 1:3], torch.tensor(expected, dtype=torch.float64))


def test_luong_attentional_state_matches_hand_computation():
    generator = torch.Generator().manual_seed(4)
    w_c = torch.nn.Linear(2 * HIDDEN, HIDDEN, bias=False).double()
    context = torch.randn(1, 2, HIDDEN, generator=generator, dtype=torch.float64)
    hidden = torch.randn(1, 2, HIDDEN, generator=generator, dtype=torch.float64)
    out = luong_attentional_state(context, hidden, w_c)
    for t in range(2):
        concat = context[0, t].tolist() + hidden[0, t].tolist()  # [c_t; h_t]
        expected = _tanh_vec(_matvec(w_c.weight, concat))
        torch.testing.assert_close(out[0, t], torch.tensor(expected, dtype=torch.float64))


def test_maxout_takes_max_of_each_pool():
    x = torch.tensor([[1.0, -2.0, 0.5, 3.0, -1.0, -4.0]])
    assert maxout(x, 2).tolist() == [[1.0, 3.0, -1.0]]


@pytest.mark.parametrize("score", ["general", "dot"])
@pytest.mark.parametrize("half_width", [1, 2])
def test_local_p_position_gaussian_and_window_match_hand_computation(score, half_width):
    module = _module("luong", score=score, window="local-p", window_size=half_width)
    query, values, mask, _ = _inputs(seed=7)
    keys = module.precompute_keys(values)
    _, weights = module(query, keys, values, mask, torch.arange(TGT_LEN))
    sigma = half_width / 2
    for b, length in enumerate(SOURCE_LENGTHS):
        for t in range(TGT_LEN):
            h_t = query[b, t].tolist()
            # eq. 9: p_t = S · sigmoid(v_pᵀ tanh(W_p h_t))
            logit = _dot(module.v_p.weight[0].tolist(), _tanh_vec(_matvec(module.w_p.weight, h_t)))
            p_t = length / (1 + math.exp(-logit))
            window = [s for s in range(length) if abs(s - p_t) <= half_width]
            assert window, "the window must keep at least one real source position"
            scores = [_hand_score(module, query, values, None, b, t, s) for s in window]
            align = dict(zip(window, _softmax(scores), strict=True))
            # eq. 10: a_t(s) = align(h_t, h̄_s) · exp(-(s - p_t)² / (2σ²)), zero outside the window
            expected = [
                align[s] * math.exp(-((s - p_t) ** 2) / (2 * sigma**2)) if s in align else 0.0 for s in range(SRC_LEN)
            ]
            torch.testing.assert_close(weights[b, t], torch.tensor(expected, dtype=torch.float64))
            assert (weights[b, t, length:] == 0).all()


def test_local_m_window_is_centred_on_t_and_clamped_to_the_real_source():
    module = _module("luong", score="dot", window="local-m", window_size=1)
    query, values, mask, _ = _inputs(seed=8)
    positions = torch.arange(6)  # t beyond the shorter source (3 tokens)
    query = torch.randn(BATCH, 6, HIDDEN, dtype=torch.float64)
    _, weights = module(query, module.precompute_keys(values), values, mask, positions)
    for b, length in enumerate(SOURCE_LENGTHS):
        for t in range(6):
            center = min(t, length - 1)
            allowed = [s for s in range(length) if abs(s - center) <= 1]
            scores = [_dot(query[b, t].tolist(), values[b, s].tolist()) for s in allowed]
            expected = dict(zip(allowed, _softmax(scores), strict=True))
            row = [expected.get(s, 0.0) for s in range(SRC_LEN)]
            torch.testing.assert_close(weights[b, t], torch.tensor(row, dtype=torch.float64))


def test_hard_attention_is_one_hot_on_the_soft_argmax_with_straight_through_gradient():
    soft_module = _module("luong", score="general")
    hard_module = _module("luong", score="general", attention_mode="hard")
    query, values, mask, _ = _inputs(seed=9)
    query.requires_grad_(True)
    keys = soft_module.precompute_keys(values)
    _, soft = soft_module(query, keys, values, mask, torch.arange(TGT_LEN))
    context, hard = hard_module(query, keys, values, mask, torch.arange(TGT_LEN))
    expected = torch.zeros_like(soft).scatter_(-1, soft.argmax(-1, keepdim=True), 1.0)
    assert torch.equal(hard, expected)
    # The context is exactly the value at the argmax.
    index = soft.argmax(-1)
    torch.testing.assert_close(context, torch.stack([values[b, index[b]] for b in range(BATCH)]))
    # Straight-through: d hard / d soft is the identity, so gradients reach the query.
    upstream = torch.randn_like(soft)
    (grad_hard,) = torch.autograd.grad((hard * upstream).sum(), query, retain_graph=True)
    (grad_soft,) = torch.autograd.grad((soft * upstream).sum(), query)
    torch.testing.assert_close(grad_hard, grad_soft)
    assert grad_hard.abs().sum() > 0


def test_straight_through_argmax_backward_is_identity():
    weights = torch.tensor([[0.2, 0.5, 0.3]], requires_grad=True)
    out = StraightThroughArgmax.apply(weights)
    assert out.tolist() == [[0.0, 1.0, 0.0]]
    out.backward(torch.tensor([[1.0, 2.0, 3.0]]))
    assert weights.grad.tolist() == [[1.0, 2.0, 3.0]]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("window", ["local-m", "local-p"])
def test_local_windows_of_a_half_precision_model_sit_on_exact_source_positions(window, dtype):
    # bfloat16 holds integers exactly only up to 256: the positions p_t stay float32, so the window
    # of a long source is where float32 puts it (local-m: exactly [t - D, t + D]).
    module = _module("luong", score="dot", window=window, window_size=2).to(dtype)
    src_len, positions = 400, torch.arange(290, 300)
    query = torch.randn(1, len(positions), HIDDEN).to(dtype)
    mask = torch.ones(1, src_len, dtype=torch.bool)
    centers = module.aligned_position(query, positions, mask.sum(-1))
    assert centers.dtype == torch.float32
    window_mask, gaussian = module.window(query, mask, positions)
    if window == "local-m":
        assert torch.equal(centers[0], positions.float())
        expected = (torch.arange(src_len) - positions[:, None]).abs() <= 2
        assert torch.equal(window_mask[0], expected)
    else:
        assert gaussian.dtype == dtype  # the weights keep the model's dtype
        float_centers = module.float().aligned_position(query.float(), positions, mask.sum(-1))
        assert (centers - float_centers).abs().max() <= src_len * 2**-8  # the gate's rounding only
