"""Attention for the RNN encoder-decoder: the scores of the seed texts, local windows, hard attention.

Every score is a small free function that writes its equation out. ``BahdanauAttention`` and
``LuongAttention`` only hold the weights; both share one call signature and one pipeline
(``RNNAttention.forward``): score → mask (padding, local window) → one attention
function, ``attend`` (softmax → [Gaussian] → [hard] → context). Key projections (U_a h_j,
W_a h̄_s) are computed once per source by ``precompute_keys`` and reused at every decoding step.

Shapes: query (batch, tgt_len, hidden_size); keys (batch, src_len, key_size);
values (batch, src_len, encoder_output_size); weights (batch, tgt_len, src_len).
``tgt_len`` is 1 when the decoder runs step by step.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

# ---------------------------------------------------------------------------------------------
# Scores: each returns (batch, tgt_len, src_len)
# ---------------------------------------------------------------------------------------------


def additive_score(
    query_proj: torch.Tensor, keys_proj: torch.Tensor, v: torch.Tensor, coverage_proj: torch.Tensor | None = None
) -> torch.Tensor:
    """Additive (MLP) score e_ij = vᵀ tanh(W s + U h_j [+ w_c cov_j]).

    Bahdanau et al. (2015), A.1.2: a(s_{i-1}, h_j) = v_aᵀ tanh(W_a s_{i-1} + U_a h_j). It is also
    Luong et al. (2015), eq. 8, "concat": v_aᵀ tanh(W_a [h_t; h̄_s]), with W_a split into the query
    and key halves. The optional coverage term is See et al. (2017), eq. 11.

    Args:
        query_proj: W s, (batch, tgt_len, hidden_size).
        keys_proj: U h, precomputed once per source, (batch, src_len, hidden_size).
        v: (hidden_size,).
        coverage_proj: w_c cov_j, (batch, tgt_len, src_len, hidden_size) or None.
    """
    features = query_proj.unsqueeze(2) + keys_proj.unsqueeze(1)  # (batch, tgt_len, src_len, hidden_size)
    if coverage_proj is not None:
        features = features + coverage_proj
    return torch.tanh(features) @ v  # (batch, tgt_len, src_len)


def dot_score(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """score(h_t, h̄_s) = h_tᵀ h̄_s (Luong et al. 2015, eq. 8, "dot"). ``keys`` are the encoder
    outputs; for "general" they are W_a h̄_s, precomputed, which makes this h_tᵀ W_a h̄_s (eq. 8)."""
    return query @ keys.transpose(1, 2)


def scaled_dot_score(query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """score(h_t, h̄_s) = h_tᵀ h̄_s / √d (Vaswani et al. 2017, eq. 1), d = query size."""
    return query @ keys.transpose(1, 2) / math.sqrt(query.size(-1))


def unit_vectors(states: torch.Tensor) -> torch.Tensor:
    """Each vector of `states` (..., size) scaled to unit L2 length; a zero vector stays zero.

    Padded encoder states are exact zeros. `F.normalize(x, eps=1e-8)` divides them by its eps,
    which rounds to 0 in float16 (0/0 = NaN, and NaN gradients through every attention step). The
    length is taken in float32, zero vectors are kept at zero without a gradient, and the result
    has `states`' dtype (float64 states are normalised in float64).
    """
    compute_dtype = torch.promote_types(states.dtype, torch.float32)  # float16/bf16 → float32; float64 stays
    norm = torch.linalg.vector_norm(states, dim=-1, keepdim=True, dtype=compute_dtype)
    scaled = (states.to(compute_dtype) / norm.clamp_min(torch.finfo(compute_dtype).tiny)).to(states.dtype)
    return torch.where(norm > 0, scaled, torch.zeros_like(scaled))


def cosine_score(query: torch.Tensor, unit_keys: torch.Tensor, key_strength: torch.Tensor) -> torch.Tensor:
    """Content-based score β_t · K[h_t, h̄_s] with the cosine similarity K[u, v] = u·v / (‖u‖ ‖v‖).

    Graves et al. (2014), Neural Turing Machines, eqs. 5-6: the key strength β_t > 0, emitted by
    the controller (here β_t = softplus(w_βᵀ h_t + b_β)), sharpens or flattens the softmax; without
    it the scores would be confined to [-1, 1].

    Args:
        query: (batch, tgt_len, hidden_size).
        unit_keys: h̄_s / ‖h̄_s‖, precomputed, (batch, src_len, hidden_size).
        key_strength: β_t, (batch, tgt_len, 1).
    """
    return key_strength * (unit_vectors(query) @ unit_keys.transpose(1, 2))


# ---------------------------------------------------------------------------------------------
# Softmax, windows, hard attention
# ---------------------------------------------------------------------------------------------


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """a_t(s) = exp(score_s) / Σ_{s' in mask} exp(score_s'), exactly 0 outside ``mask``.

    Bahdanau et al. (2015), eq. 6; Luong et al. (2015), eq. 7. scores: (batch, tgt_len, src_len);
    mask: bool, broadcastable to scores, True where attention is allowed (every row needs one).
    """
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def local_p_position(query: torch.Tensor, w_p: nn.Linear, v_p: nn.Linear, source_lengths: torch.Tensor) -> torch.Tensor:
    """Predicted aligned position p_t = S · sigmoid(v_pᵀ tanh(W_p h_t)) (Luong et al. 2015, eq. 9).

    S is each sentence's real source length, so p_t ∈ [0, S]. query: (batch, tgt_len, hidden_size);
    source_lengths: (batch,). Returns (batch, tgt_len), in float32 at least: a position in bfloat16
    is off by up to one token past 256 (8-bit mantissa), which would move the window of eq. 10.
    """
    gate = torch.sigmoid(v_p(torch.tanh(w_p(query)))).squeeze(-1)
    compute_dtype = torch.promote_types(gate.dtype, torch.float32)
    return source_lengths.unsqueeze(1).to(compute_dtype) * gate.to(compute_dtype)


def local_m_position(positions: torch.Tensor, source_lengths: torch.Tensor) -> torch.Tensor:
    """Monotonic aligned position p_t = t (Luong et al. 2015, §3.2, local-m).

    Departure: p_t is clamped to the last real source position S - 1, so a target longer than its
    source still has a non-empty window. positions: (tgt_len,); source_lengths: (batch,).
    Returns (batch, tgt_len).
    """
    return torch.minimum(positions.unsqueeze(0), (source_lengths - 1).unsqueeze(1)).to(torch.float32)


def window_mask(centers: torch.Tensor, half_width: int, src_len: int) -> torch.Tensor:
    """True at source positions s with |s - p_t| <= D (the window [p_t - D, p_t + D], §3.2).

    centers: (batch, tgt_len). Returns bool (batch, tgt_len, src_len); intersect it with the padding
    mask so the window only covers the real source.
    """
    source_positions = torch.arange(src_len, device=centers.device, dtype=centers.dtype)
    return (source_positions - centers.unsqueeze(-1)).abs() <= half_width


def gaussian_weights(centers: torch.Tensor, sigma: float, src_len: int) -> torch.Tensor:
    """exp(-(s - p_t)² / (2σ²)) with σ = D/2 (Luong et al. 2015, eq. 10).

    centers: (batch, tgt_len). Returns (batch, tgt_len, src_len).
    """
    source_positions = torch.arange(src_len, device=centers.device, dtype=centers.dtype)
    return torch.exp(-((source_positions - centers.unsqueeze(-1)) ** 2) / (2 * sigma**2))


def one_hot_argmax(weights: torch.Tensor) -> torch.Tensor:
    """1 at the argmax of the last axis, 0 elsewhere: hard attention's forward pass."""
    index = weights.argmax(dim=-1, keepdim=True)
    return torch.zeros_like(weights).scatter_(-1, index, 1.0)


class StraightThroughArgmax(torch.autograd.Function):
    """Hard attention: forward puts all weight on the argmax; backward is the identity.

    The straight-through estimator (Bengio et al. 2013): the one-hot choice is used in the
    forward pass and its gradient is passed unchanged to the soft weights it was taken from, so
    the scores keep learning. (Xu et al. 2015 train hard attention with REINFORCE instead; the
    straight-through estimator is biased but needs no sampling or baseline.)
    """

    @staticmethod
    def forward(ctx, weights: torch.Tensor) -> torch.Tensor:
        return one_hot_argmax(weights)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output


def attend(
    scores: torch.Tensor,
    mask: torch.Tensor,
    values: torch.Tensor,
    window_weights: torch.Tensor | None = None,
    hard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention function every RNN attention calls: weights from scores, then the context.

    a_t(s) = softmax over the allowed positions of score_s (Bahdanau et al. 2015, eq. 6; Luong et
    al. 2015, eq. 7), times local-p's Gaussian (eq. 10), made one-hot for hard attention
    (straight-through); c_t = Σ_s a_t(s) h̄_s (Bahdanau eq. 5; Luong §3.1).

    Args:
        scores: (batch, tgt_len, src_len).
        mask: bool, broadcastable to scores, True where attention is allowed (every row needs one).
        values: encoder outputs h̄_s, (batch, src_len, encoder_output_size).
        window_weights: (batch, tgt_len, src_len) multiplied into the weights after the softmax, or None.
        hard: all weight on the argmax in forward, the soft weights' gradient in backward.

    Returns:
        context (batch, tgt_len, encoder_output_size), weights (batch, tgt_len, src_len).
    """
    weights = masked_softmax(scores, mask)
    if window_weights is not None:
        weights = weights * window_weights
    if hard:
        # Without a gradient to pass on, the one-hot itself (what a traced/exported graph records).
        weights = StraightThroughArgmax.apply(weights) if weights.requires_grad else one_hot_argmax(weights)
    return weights @ values, weights


# ---------------------------------------------------------------------------------------------
# Attention modules
# ---------------------------------------------------------------------------------------------


class RNNAttention(nn.Module):
    """Shared pipeline of every attention: score (the subclass's projections) → ``window`` (the
    padding mask [and local window]) → one call to ``attend`` (softmax → [Gaussian] → [hard] →
    context). The output projection (Luong's W_c, eq. 5; Bahdanau's deep output) is the decoder's.

    Subclasses define ``precompute_keys(encoder_hidden_states)`` and ``score(query, keys, coverage)``.
    """

    def __init__(self, config):
        super().__init__()
        self.window_kind = config.window
        self.window_size = config.window_size
        self.hard = config.attention_mode == "hard"

    def precompute_keys(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def score(self, query: torch.Tensor, keys: torch.Tensor, coverage: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def aligned_position(
        self, query: torch.Tensor, positions: torch.Tensor, source_lengths: torch.Tensor
    ) -> torch.Tensor:
        raise NotImplementedError(f"window={self.window_kind!r} is not available for {type(self).__name__}")

    def forward(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        attention_mask: torch.Tensor,
        positions: torch.Tensor,
        coverage: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``query`` over the source.

        Args:
            query: decoder states, (batch, tgt_len, hidden_size).
            keys: output of ``precompute_keys``, (batch, src_len, key_size).
            values: encoder outputs h_j, (batch, src_len, encoder_output_size).
            attention_mask: bool (batch, src_len), True on real source tokens.
            positions: target positions t of the query rows, (tgt_len,) long (local windows).
            coverage: Σ of past weights, (batch, src_len), or None.

        Returns:
            context c_t: (batch, tgt_len, encoder_output_size); weights a_t: (batch, tgt_len, src_len).
            Weights are exactly 0 on padding and outside the window, and sum to 1 over the
            allowed positions, except for local-p, whose Gaussian (eq. 10) scales them after the
            softmax, as in the paper.
        """
        scores = self.score(query, keys, coverage)  # projections and score: (batch, tgt_len, src_len)
        mask, window_weights = self.window(query, attention_mask, positions)
        return attend(scores, mask, values, window_weights, hard=self.hard)

    def window(
        self, query: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Where each query may attend, and local-p's Gaussian (Luong et al. 2015, §3.2).

        Returns:
            mask: bool (batch, 1 | tgt_len, src_len), the real source tokens [inside the window
            [p_t − D, p_t + D]]; window_weights: exp(−(s − p_t)² / 2σ²) (eq. 10), (batch, tgt_len,
            src_len), for local-p only, else None.
        """
        mask = attention_mask.unsqueeze(1)  # (batch, 1, src_len)
        if self.window_kind == "global":
            return mask, None
        src_len = attention_mask.size(-1)
        centers = self.aligned_position(query, positions, attention_mask.sum(-1))  # (batch, tgt_len)
        mask = mask & window_mask(centers, self.window_size, src_len)
        if self.window_kind != "local-p":
            return mask, None
        # Positions are float32 (see local_p_position); the weights take the scores' dtype.
        return mask, gaussian_weights(centers, self.window_size / 2, src_len).to(query.dtype)


class BahdanauAttention(RNNAttention):
    """Bahdanau et al. (2015), A.1.2: e_ij = v_aᵀ tanh(W_a s_{i-1} + U_a h_j [+ w_c cov_j]).

    The query is the *previous* decoder state s_{i-1}; U_a h_j is computed once per source.
    """

    def __init__(self, config):
        super().__init__(config)
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)  # W_a
        self.k_proj = nn.Linear(config.encoder_output_size, config.hidden_size, bias=True)  # U_a (+ b_attn)
        self.v = nn.Parameter(torch.empty(config.hidden_size))  # v_a
        self.coverage_proj = nn.Linear(1, config.hidden_size, bias=False) if config.coverage else None  # w_c

    def precompute_keys(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        return self.k_proj(encoder_hidden_states)  # (batch, src_len, hidden_size)

    def score(self, query, keys, coverage):
        coverage_proj = None
        if self.coverage_proj is not None:
            coverage_proj = self.coverage_proj(coverage[:, None, :, None])  # (batch, 1, src_len, hidden_size)
        return additive_score(self.q_proj(query), keys, self.v, coverage_proj)


class LuongAttention(RNNAttention):
    """Luong et al. (2015), §3: scores h_t (the *current* decoder state) against h̄_s.

    score = "dot" h_tᵀ h̄_s | "general" h_tᵀ W_a h̄_s | "concat" v_aᵀ tanh(W_a [h_t; h̄_s]) (eq. 8),
    "cosine" β_t cos(h_t, h̄_s) (Graves et al. 2014, eqs. 5-6), "scaled_dot" h_tᵀ h̄_s / √d
    (Vaswani et al. 2017, eq. 1). Key-side work (W_a h̄_s, U h̄_s, h̄_s/‖h̄_s‖) is precomputed.
    Local windows (§3.2): local-m p_t = t, local-p eq. 9 with the Gaussian of eq. 10.
    """

    def __init__(self, config):
        super().__init__(config)
        self.score_name = config.score
        hidden, keys_in = config.hidden_size, config.encoder_output_size
        if self.score_name == "general":
            self.k_proj = nn.Linear(keys_in, hidden, bias=False)  # W_a
        elif self.score_name == "concat":
            self.q_proj = nn.Linear(hidden, hidden, bias=False)  # W_a, query half
            self.k_proj = nn.Linear(keys_in, hidden, bias=True)  # W_a, key half (+ b_attn)
            self.v = nn.Parameter(torch.empty(hidden))  # v_a
            self.coverage_proj = nn.Linear(1, hidden, bias=False) if config.coverage else None  # w_c
        elif self.score_name == "cosine":
            self.key_strength = nn.Linear(hidden, 1)  # β_t = softplus(w_βᵀ h_t + b_β)
        if self.window_kind == "local-p":
            self.w_p = nn.Linear(hidden, hidden, bias=False)  # W_p
            self.v_p = nn.Linear(hidden, 1, bias=False)  # v_p

    def precompute_keys(self, encoder_hidden_states: torch.Tensor) -> torch.Tensor:
        if self.score_name in ("general", "concat"):
            return self.k_proj(encoder_hidden_states)  # (batch, src_len, hidden_size)
        if self.score_name == "cosine":
            return unit_vectors(encoder_hidden_states)  # zero (padded) states stay zero, also in float16
        return encoder_hidden_states

    def score(self, query, keys, coverage):
        if self.score_name in ("dot", "general"):
            return dot_score(query, keys)
        if self.score_name == "scaled_dot":
            return scaled_dot_score(query, keys)
        if self.score_name == "cosine":
            return cosine_score(query, keys, F.softplus(self.key_strength(query)))
        coverage_proj = None
        if self.coverage_proj is not None:
            coverage_proj = self.coverage_proj(coverage[:, None, :, None])  # (batch, 1, src_len, hidden_size)
        return additive_score(self.q_proj(query), keys, self.v, coverage_proj)

    def aligned_position(self, query, positions, source_lengths):
        if self.window_kind == "local-m":
            return local_m_position(positions, source_lengths)  # float32: exact source positions
        return local_p_position(query, self.w_p, self.v_p, source_lengths)


def luong_attentional_state(context: torch.Tensor, hidden: torch.Tensor, w_c: nn.Linear) -> torch.Tensor:
    """Attentional hidden state h̃_t = tanh(W_c [c_t; h_t]) (Luong et al. 2015, eq. 5).

    context: (batch, tgt_len, encoder_output_size); hidden: (batch, tgt_len, hidden_size).
    Returns (batch, tgt_len, hidden_size). (W_c has no bias in the paper; we keep none.)
    """
    return torch.tanh(w_c(torch.cat([context, hidden], dim=-1)))


def maxout(x: torch.Tensor, pool_size: int) -> torch.Tensor:
    """t_i = [max{t̃_{i,2j-1}, t̃_{i,2j}}]_j (Goodfellow et al. 2013; Bahdanau et al. 2015, A.2.2).

    x: (..., pool_size * units). Returns (..., units).
    """
    return x.unflatten(-1, (-1, pool_size)).amax(dim=-1)
