"""Every speed-only departure of the models from their reference code, in one place.

The modeling files are written as the papers state them (eq. 1 through transformers' attention
interface, `F.dropout`, `lm_head(hidden_states)`, `F.cross_entropy`). Where a faster way to get
the same numbers was measured, the reference code asks one seam, `fast_paths(config)`: it returns
`CPU_FAST_PATHS` (an instance of `CPUFastPaths`, whose methods hold each fast path) when
`config.use_cpu_fast_paths` is True (the default), and None when it is False; then every call site
takes its plain reference line. The two give the same logits, loss and gradients up to float
rounding and the same `generate` output (tests/test_cpu_fast_paths.py); only dropout draws its
random masks differently.

Every fast path applies only where the modules it stands in for are plain (`plain_linears`: exactly
`nn.Linear` with plain parameters and no hooks); a layer that peft wrapped, `quantize_dynamic`
replaced or a hook watches is called instead. No path changes which parameters get gradients.
Nothing here times, measures or writes anything: the same inputs take the same path on every
machine. What each path saved, measured on named hosts with dates, is in benchmarks/README.md
("The CPU fast paths, measured"); benchmarks/probes/probe_fast_paths.py measures them against the
reference on any host.

- `attention_kernel`: eq. 1 as two batched matmuls instead of torch's CPU SDPA (a flash kernel
  tiled for long sequences), on a CPU under `attn_implementation="sdpa"`: decoding steps with up
  to `_DECODE_STEP_MAX_QUERIES` queries per source (float32), and training with up to
  `_TRAIN_STEP_MAX_KEYS` keys; and the attention in float32 while training under CPU half
  precision (torch's CPU SDPA backward in bf16 is several times slower than in float32).
- `dropout`: masks from 64-bit random draws cut into four 15-bit uniforms (CPU, training, the
  Transformer).
- `padding_free_layout`: the encoder's position-wise layers on the real tokens only (inference
  with padded sources, any device).
- `fused_projection`: projections that read the same input (Q, K, V; K, V of the encoder output)
  as one matrix multiply, the concatenated weight built once per decoding run instead of at every
  step.
- `token_loss_sum`: the fused label-smoothed cross-entropy (`_LabelSmoothedCrossEntropy`): its
  backward writes softmax − target into one gradient, 2 × (tokens, vocab_size) less peak memory
  on every device; on a CPU it works through ~4 MiB row blocks that stay in the cache.

Imports only the standard library and torch: shipped to the Hub beside the modeling files.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

_HALF_DTYPES = (torch.float16, torch.bfloat16)
# In a decoding step with a cache (CPU, float32) and up to this many queries per (source, head),
# eq. 1 runs as plain matmuls instead of SDPA: a step has 1 query per sentence (greedy) or
# num_beams (beam search: the queries of a source's beams are stacked).
_DECODE_STEP_MAX_QUERIES = 8
# Training on a CPU with at most this many keys per row (Multi30k-length sentences), eq. 1 runs
# as plain matmuls instead of SDPA: torch's CPU flash-attention kernel, tiled for long sequences,
# made a whole Transformer-small training step 7-12% slower at 12-32 tokens and broke even at
# 48-64 under bf16 autocast, 2-6% slower in float32 (2 threads of an AMD EPYC; benchmarks/README.md,
# "What made the training step faster", third pass). The eager path's attention dropout is
# F.dropout (the recipes train with attention_dropout 0).
_TRAIN_STEP_MAX_KEYS = 32


# --------------------------------------------------------------------------------------------
# When a fast path may stand in for calling a module
# --------------------------------------------------------------------------------------------


def has_hooks(module: nn.Module) -> bool:
    """Whether calling `module` would run anything besides its `forward`: hooks registered on it or,
    through `torch.nn.modules.module.register_module_*_hook`, on every module."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    on_module = any(getattr(module, kind, None) for kind in kinds)
    on_all = any(getattr(torch.nn.modules.module, "_global" + kind, None) for kind in kinds)
    return on_module or on_all


def plain_linears(*layers: nn.Module) -> bool:
    """True when every layer is exactly `nn.Linear` (not a subclass, nor a replacement such as
    peft's LoRA `Linear`, a quantized or parametrized layer) with plain `nn.Parameter` weight and
    bias and no hooks: only then may a fast path read `layer.weight` instead of calling the layer.
    Anything else must be called, so that it does its own work."""
    return all(
        type(layer) is nn.Linear
        and type(layer.weight) is nn.Parameter
        and (layer.bias is None or type(layer.bias) is nn.Parameter)
        and not has_hooks(layer)
        for layer in layers
    )


# --------------------------------------------------------------------------------------------
# Attention kernel choice (eq. 1 as matmuls, float32 attention under CPU half precision)
# --------------------------------------------------------------------------------------------


def _attention_kernel(
    module: nn.Module,
    interface: Callable,
    eager: Callable,
    query: torch.Tensor,
    key: torch.Tensor,
    decoding: bool,
) -> Callable:
    """`interface` (the function of `config._attn_implementation`), or a function with the same
    signature and results (up to float rounding) that runs faster on a CPU.

    Args:
        module: the attention module (reads `training` and `config._attn_implementation`).
        interface: what transformers' attention interface chose (eager or SDPA).
        eager: eq. 1 in plain torch, same signature (`eager_attention_forward`).
        query: (batch, num_heads, q_len, head_dim); key: (batch, num_heads, kv_len, head_dim).
        decoding: a decoding step with a cache (one new position per decoder row).
    """
    if query.device.type != "cpu":
        return interface
    sdpa = module.config._attn_implementation == "sdpa"
    if module.training:
        as_matmuls = sdpa and key.size(2) <= _TRAIN_STEP_MAX_KEYS
        in_float32 = query.dtype in _HALF_DTYPES
    else:
        as_matmuls = sdpa and decoding and query.size(2) <= _DECODE_STEP_MAX_QUERIES and query.dtype == torch.float32
        in_float32 = False
    if not (as_matmuls or in_float32):
        return interface
    kernel = eager if as_matmuls else interface

    def attention(module, query, key, value, attention_mask, **kwargs):
        compute_dtype = query.dtype
        if in_float32:
            # CPU half precision: the projections run as bf16 GEMMs (2.3x the float32 FLOP/s on
            # AVX512-BF16 cores), but torch's CPU SDPA backward in bf16 is ~5x slower than in float32.
            query, key, value = query.float(), key.float(), value.float()
        with torch.autocast("cpu", enabled=False) if in_float32 else contextlib.nullcontext():
            output, weights = kernel(module, query, key, value, attention_mask, **kwargs)
        # As under SDPA, which never materialises the weights
        return output.to(compute_dtype), (None if as_matmuls else weights)

    return attention


# --------------------------------------------------------------------------------------------
# Dropout with cheaper masks (Srivastava et al. 2014)
# --------------------------------------------------------------------------------------------

_RESOLUTION = 1 << 15  # 15 uniform bits per element


def _drop_threshold(p: float) -> int:
    """k = round(p · 2¹⁵): an element is dropped when its 15-bit uniform number is < k."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    return round(p * _RESOLUTION)


def dropout_keep_mask(shape: torch.Size, p: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The inverted-dropout multiplier: 1 / (1 − p') with probability 1 − p', else 0, where
    p' = round(p · 2¹⁵) / 2¹⁵.

    Args:
        shape: the activation's shape, e.g. (batch, seq_len, d_model).
        p: drop probability.
        dtype, device: of the returned tensor.

    Returns:
        A tensor of `shape` and `dtype` on `device`.

    Raises:
        ValueError: p outside [0, 1], or so close to 1 that p' = 1 (nothing would be kept).
    """
    threshold = _drop_threshold(p)
    if threshold >= _RESOLUTION:
        raise ValueError(f"dropout probability {p} rounds to 1 at 15-bit resolution: nothing would be kept")
    numel = shape.numel()
    # torch's int64 random_() is uniform on [0, 2^63): bits 0..62 are fair coins, so each of the
    # four 16-bit lanes of a draw holds 15 uniform bits once bit 15 is masked off.
    bits = torch.empty((numel + 3) // 4, dtype=torch.int64, device=device).random_()
    lanes = bits.view(torch.int16)[:numel].view(shape)
    keep = lanes.bitwise_and_(_RESOLUTION - 1).ge_(threshold)
    return keep.to(dtype).mul_(_RESOLUTION / (_RESOLUTION - threshold))


def dropout(input: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout (Srivastava et al. 2014, JMLR 15, §4: r ~ Bernoulli(1 − p) per unit, scaled
    by 1/(1 − p) while training instead of at test time, as torch does).

    Same contract as `F.dropout(input, p, training)`; on a CPU the mask comes from
    `dropout_keep_mask` (p rounded to a multiple of 2⁻¹⁵; a p that rounds to 1 drops everything):
    torch's CPU `F.dropout` draws one Bernoulli sample per element, this draws 64 random bits per
    call of the generator and cuts them into four 15-bit uniform numbers. Other devices keep
    `F.dropout` (fused kernels; nothing to gain).

    Args:
        input: any shape, e.g. (batch, seq_len, d_model).
        p: drop probability.
        training: identity when False.

    Returns:
        A tensor shaped like `input`.

    Raises:
        ValueError: p outside [0, 1].
    """
    threshold = _drop_threshold(p)
    if not training or p == 0.0:
        return input
    if input.device.type != "cpu" or not input.is_floating_point():
        return F.dropout(input, p, training)
    if threshold >= _RESOLUTION:
        return input * 0.0
    return input * dropout_keep_mask(input.shape, p, input.dtype, input.device)


# --------------------------------------------------------------------------------------------
# Q, K, V of a decoding step: the fused weight built once per decoding run
# --------------------------------------------------------------------------------------------


class _FusedWeight:
    """[W_1; W_2; ...] and [b_1; b_2; ...] of some Linear layers, valid for one decoding run
    (`scope`: a weak reference to that `generate()` call's cache) and these very weights."""

    __slots__ = ("scope", "data_ptrs", "weight", "bias")

    def __init__(self, projections: tuple[nn.Linear, ...], scope: object):
        self.scope = weakref.ref(scope)
        self.data_ptrs = tuple(p.weight.data_ptr() for p in projections)
        self.weight = torch.cat([p.weight for p in projections])
        self.bias = torch.cat([p.bias for p in projections])

    def matches(self, projections: tuple[nn.Linear, ...], scope: object) -> bool:
        return self.scope() is scope and self.data_ptrs == tuple(p.weight.data_ptr() for p in projections)


_FUSED: weakref.WeakKeyDictionary[nn.Linear, _FusedWeight] = weakref.WeakKeyDictionary()


def fused_projection(
    hidden_states: torch.Tensor, projections: tuple[nn.Module, ...], scope: object | None = None
) -> torch.Tensor | None:
    """[x W_1ᵀ + b_1; x W_2ᵀ + b_2; ...] = x [W_1; W_2; ...]ᵀ + [b_1; b_2; ...]: several Linear layers
    that read the same input as one matrix multiply (Q, K, V of self-attention; K, V of
    cross-attention), or None when a layer must be called instead (`plain_linears`: a LoRA-wrapped,
    quantized or hooked projection), so that the caller calls each layer.

    Concatenating the (d_model, d_model) weights costs O(d_model²) per call, nothing next to a
    training batch's O(tokens · d_model²) multiply, but in a decoding step the multiply has one row
    per sentence (64 × 256 rows against a 768 × 256 weight in benchmark 3). So during a decoding
    run (`scope`, the run's cache, the same object at every step; autograd recording nothing) the
    concatenated weight is built at the first step and reused until the run ends; a new run
    concatenates again, so weights changed between runs are always seen. The parameters stay
    separate and named as in Marian/BART (`q_proj`, `k_proj`, `v_proj`), and get the gradients that
    calling the layers gives.

    Args:
        hidden_states: (batch, len, d_model), or (tokens, d_model).
        projections: the layers, d_model → d_model each.
        scope: the decoding cache of the running `generate()` call; None outside decoding.

    Returns:
        (..., len(projections) · d_model), the outputs side by side; or None.
    """
    if not plain_linears(*projections) or any(p.bias is None for p in projections):
        return None
    if scope is None or torch.is_grad_enabled() or torch.compiler.is_compiling():
        weight = torch.cat([p.weight for p in projections])
        return F.linear(hidden_states, weight, torch.cat([p.bias for p in projections]))
    entry = _FUSED.get(projections[0])
    if entry is None or not entry.matches(projections, scope):
        entry = _FUSED[projections[0]] = _FusedWeight(projections, scope)
    return F.linear(hidden_states, entry.weight, entry.bias)


# --------------------------------------------------------------------------------------------
# The encoder on real tokens only
# --------------------------------------------------------------------------------------------


class PaddingFreeLayout:
    """The real (non-padding) tokens of a padded batch, for running position-wise work on them only.

    Encoding a batch at inference, every linear layer, LayerNorm and feed-forward network acts on
    each position independently, so they can run on the (tokens, d_model) matrix of real tokens
    instead of (batch · src_len, d_model): padding costs nothing there. Only self-attention needs
    the (batch, num_heads, src_len, head_dim) layout; it scatters its projected Q, K, V into it and
    gathers its output back (the "remove padding" of FasterTransformer's encoder, and the nested
    tensors of PyTorch's BetterTransformer fast path). On Multi30k test2016 in file order, batches of
    64, 53% of the padded source positions are padding.

    Args:
        attention_mask: (batch, src_len), 1 for tokens and 0 for padding.

    Attributes:
        index: (tokens,) positions of the real tokens in the flattened (batch · src_len) grid.
        padding: the other positions.
        batch, src_len: the padded shape.
    """

    def __init__(self, attention_mask: torch.Tensor):
        self.batch, self.src_len = attention_mask.shape
        flat = attention_mask.reshape(-1)
        self.index = flat.nonzero().squeeze(1)
        self.padding = (flat == 0).nonzero().squeeze(1)  # (padding positions,)

    @staticmethod
    def worth_it(attention_mask: torch.Tensor | None) -> bool:
        """True when the mask hides any position (otherwise gathering would only cost time)."""
        return attention_mask is not None and not bool(attention_mask.all())

    def unpad(self, states: torch.Tensor) -> torch.Tensor:
        """(batch, src_len, features) → (tokens, features)."""
        return states.reshape(self.batch * self.src_len, -1).index_select(0, self.index)

    def pad(self, tokens: torch.Tensor) -> torch.Tensor:
        """(tokens, features) → (batch, src_len, features), zeros at padding."""
        # Each row written once: the real tokens copied, the padding rows zeroed (not all rows zeroed first).
        padded = tokens.new_empty(self.batch * self.src_len, tokens.size(-1))
        padded.index_copy_(0, self.index, tokens).index_fill_(0, self.padding, 0.0)
        return padded.view(self.batch, self.src_len, -1)


# --------------------------------------------------------------------------------------------
# The fused label-smoothed cross-entropy
# --------------------------------------------------------------------------------------------


# On a CPU the loss walks the (tokens, vocab_size) logits in blocks of rows of about this many
# float32 bytes, so each block's float32 copy, softmax and gradient stay in the cache instead of
# streaming several full-vocab float32 temporaries through memory (benchmarks/probes/probe_loss_blocks.py;
# benchmarks/README.md, fourth pass). Other devices take all rows as one block.
_LOSS_BLOCK_BYTES = 1 << 22


def _loss_block_rows(logits: torch.Tensor) -> int:
    """Rows per block of the cross-entropy's loops: ~4 MiB of float32 on a CPU, all rows elsewhere."""
    if logits.device.type != "cpu":
        return max(1, logits.size(0))
    return max(1, _LOSS_BLOCK_BYTES // (4 * max(1, logits.size(-1))))


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """Label-smoothed cross-entropy whose backward writes softmax − target straight into one
    (tokens, vocab_size) gradient.

    `F.cross_entropy` keeps the log-softmax output for backward and builds two more full-vocab
    tensors there (the gradient of the log-probabilities, then of the logits); this keeps only
    the logits (alive anyway as the model output) and a per-token log-sum-exp, and allocates the
    single gradient tensor in backward. Same numbers, 2 × (tokens, vocab_size) less peak memory.
    On a CPU both passes go through the rows in cache-sized blocks (`_loss_block_rows`). Each row's
    numbers are those of one block bit for bit for row-contiguous logits (the model's) of a
    vocabulary under 32,768 pieces; otherwise torch may reduce a short block's rows in another
    order (a difference of 1 ulp).
    """

    @staticmethod
    def forward(
        ctx, logits: torch.Tensor, labels: torch.Tensor, epsilon: float, ignore_index: int, mean: bool
    ) -> torch.Tensor:
        keep = labels != ignore_index
        targets = labels.masked_fill(~keep, 0)[:, None]  # (tokens, 1)
        stats_dtype = torch.promote_types(logits.dtype, torch.float32)  # half → float32 for the range
        num_tokens, rows = logits.size(0), _loss_block_rows(logits)
        log_normalizer = logits.new_empty(num_tokens, dtype=stats_dtype)  # log Σ_v exp(logit_v)
        mean_logit = logits.new_empty(num_tokens, dtype=stats_dtype) if epsilon > 0.0 else None
        for start in range(0, num_tokens, rows):
            block = logits[start : start + rows].to(stats_dtype)
            log_normalizer[start : start + rows] = torch.logsumexp(block, dim=-1)
            if mean_logit is not None:
                mean_logit[start : start + rows] = block.mean(dim=-1)
        per_token = log_normalizer - logits.gather(-1, targets).squeeze(-1).to(stats_dtype)  # −log p(y)
        if epsilon > 0.0:
            # −(1/V) Σ_v log p(v) = log Σ exp − mean(logits)
            per_token = (1.0 - epsilon) * per_token + epsilon * (log_normalizer - mean_logit)
        count = keep.sum().clamp(min=1) if mean else torch.ones((), device=logits.device)
        ctx.save_for_backward(logits, log_normalizer, targets, keep, count)
        ctx.epsilon, ctx.rows = epsilon, rows
        return (per_token * keep).sum() / count

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, log_normalizer, targets, keep, count = ctx.saved_tensors
        epsilon, vocab_size, rows, num_tokens = ctx.epsilon, logits.size(-1), ctx.rows, logits.size(0)
        scale = (keep * (grad_output / count))[:, None]  # (tokens, 1): 0 on ignored tokens
        target_weight = torch.full_like(log_normalizer[:rows, None], epsilon - 1.0)
        grad = None if rows >= num_tokens > 0 else torch.empty_like(logits)  # None: one block, returned as is
        for start in range(0, num_tokens, rows):
            stop = min(start + rows, num_tokens)
            # softmax (float32 for half-precision logits: type promotion), then − the smoothed target
            block = torch.sub(logits[start:stop], log_normalizer[start:stop, None]).exp_()
            if epsilon > 0.0:
                block.sub_(epsilon / vocab_size)
            block.scatter_add_(-1, targets[start:stop], target_weight[: stop - start])
            block.mul_(scale[start:stop])
            if grad is None:
                return block.to(logits.dtype), None, None, None, None
            grad[start:stop] = block
        return grad, None, None, None, None


def label_smoothed_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    epsilon: float = 0.0,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Σ over kept tokens of (1 − ε)·(−log p(y)) + ε·(−(1/V) Σ_v log p(v)), divided by their count
    for `reduction="mean"`: cross-entropy with label smoothing ε_ls (Vaswani et al. 2017, §5.4;
    Szegedy et al. 2016, §7), the value of `F.cross_entropy(logits, labels,
    ignore_index=ignore_index, label_smoothing=epsilon, reduction=reduction)` (the reference,
    `losses.token_loss_sum`), computed by the fused `_LabelSmoothedCrossEntropy`.

    Args:
        logits: (tokens, vocab_size); half-precision logits are upcast to float32 for the softmax.
        labels: (tokens,) target ids, `ignore_index` where a position does not count.
        reduction: `"mean"` or `"sum"` (e.g. to normalise by the tokens of an accumulated batch).

    Returns:
        A float32 (float64 for float64 logits) scalar; 0 when every label is ignored.

    Raises:
        ValueError: an unknown `reduction`.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be one of 'mean', 'sum'; got {reduction!r}")
    return _LabelSmoothedCrossEntropy.apply(logits, labels, epsilon, ignore_index, reduction == "mean")


# --------------------------------------------------------------------------------------------
# The seam
# --------------------------------------------------------------------------------------------


class CPUFastPaths:
    """The fast paths, as the reference code calls them through `fast_paths(config)`."""

    attention_kernel = staticmethod(_attention_kernel)
    dropout = staticmethod(dropout)
    fused_projection = staticmethod(fused_projection)

    @staticmethod
    def padding_free_layout(attention_mask: torch.Tensor | None) -> PaddingFreeLayout | None:
        """A `PaddingFreeLayout` when the (batch, src_len) mask hides any position, else None."""
        return PaddingFreeLayout(attention_mask) if PaddingFreeLayout.worth_it(attention_mask) else None

    @staticmethod
    def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, epsilon: float) -> torch.Tensor:
        """`losses.token_loss_sum` through the fused loss: logits (tokens, vocab_size), labels (tokens,)."""
        return label_smoothed_cross_entropy(logits, labels, epsilon, reduction="sum")


CPU_FAST_PATHS = CPUFastPaths()


def fast_paths(config) -> CPUFastPaths | None:
    """The one seam between the reference models and their fast paths: `CPU_FAST_PATHS` when
    `config.use_cpu_fast_paths` (default True; configs saved before the field existed count as
    True), None when it is False (every caller then runs its plain reference line)."""
    return CPU_FAST_PATHS if getattr(config, "use_cpu_fast_paths", True) else None


__all__ = [
    "CPU_FAST_PATHS",
    "fused_projection",
    "CPUFastPaths",
    "PaddingFreeLayout",
    "dropout",
    "dropout_keep_mask",
    "fast_paths",
    "label_smoothed_cross_entropy",
]
