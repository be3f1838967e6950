"""Every speed-only departure of the models from their reference code, in one place.

The modeling files are written as the papers state them (eq. 1 through transformers' attention
interface, `F.dropout`, `lm_head(hidden_states)`, `F.cross_entropy`). Where a faster way to get
the same numbers was measured, the reference code asks one seam, `fast_paths(config)`: it returns
`CPU_FAST_PATHS` (an instance of `CPUFastPaths`, whose methods hold each fast path) when
`config.use_cpu_fast_paths` is True (the default), and None when it is False; then every call site
takes its plain reference line. The two give the same logits, loss and gradients up to float
rounding and the same `generate` output (tests/test_cpu_fast_paths.py); only dropout draws its
random masks differently.

What each path is for, as measured (benchmarks/README.md; 2 threads):

- `attention_kernel`, eq. 1 as two batched matmuls instead of torch's CPU SDPA (a flash kernel
  tiled for long sequences). Applies on a CPU under `attn_implementation="sdpa"`: decoding steps
  with up to `_DECODE_STEP_MAX_QUERIES` queries per source (float32), and training with up to
  `_TRAIN_STEP_MAX_KEYS` keys. Measured on a 2-core AMD EPYC: a decoding step's cross-attention
  157 → 127 µs (1.24x); the whole Transformer-small training step 7-12% faster at 12-32 tokens. On
  an Intel Xeon host (2026-12) the training-step dispatch measured 1.01x, i.e. nothing
  (benchmarks/probe_fast_paths.py measures it against the reference on any host).
- `attention_kernel`, the attention in float32 while training under CPU half precision (bf16/fp16
  q, k, v). AMD EPYC with AVX512-BF16: bf16 SDPA backward 174 ms per step, 27 ms in float32 (6.4x).
- `dropout`, masks from 64-bit random draws cut into four 15-bit uniforms (CPU, training, the
  Transformer). AMD EPYC: forward + backward of a (1024, 256) dropout 2.51 → 0.54 ms (4.6x); in
  the RNN's benchmark step the same masks measured slower, so the RNN keeps `F.dropout`.
- `padding_free_layout`, the encoder's position-wise layers on the real tokens only (inference
  with padded sources, any device). AMD EPYC: the encoder on a (64 × 32) test2016 batch with 53%
  padding, 42.7 → 25.0 ms (1.71x).
- `output_projection`, `lm_head` through oneDNN's prepacked-weight GEMM (a private
  `torch.ops.mkldnn` op; CPU float32 decoding steps without autograd), where packing is measured
  to pay off on the machine (`packing_pays_off`, decided once per CPU and kept). AMD EPYC: (64 ×
  256) · (256 × 8,000) 2.68 → 1.24 ms (2.2x), packing 0.5 ms: packed. Intel Xeon with AMX
  (2026-12-02): 1.14x per step, packing 5.5 ms per run: greedy decoding 4% slower, so not packed.
- `fused_projection`, the concatenated Q, K, V weight of decoder self-attention built once per
  decoding run instead of at every step (decoding steps without autograd, any device). Intel Xeon,
  2 threads: greedy benchmark 3 1.13 → 1.15x Marian (benchmarks/probe_cpu_paths.py).
- `token_loss_sum`, the fused label-smoothed cross-entropy (`_LabelSmoothedCrossEntropy`): its
  backward writes softmax − target into one gradient, 2 × (tokens, vocab_size) less peak memory
  on every device; on a CPU it works through ~4 MiB row blocks that stay in the cache.

All of them together against the reference (`use_cpu_fast_paths=False`), on an Intel Xeon host
(2026-12-02, 1 thread, the machine shared with other jobs; benchmarks/probe_fast_paths.py, paired
and interleaved): a training step on Multi30k batches of ≤ 1,024 target tokens took 0.94x the
reference's time (median of 12 rounds, IQR 0.90-1.00); greedy and beam-5 `generate` of 64
sentences 1.04x and 0.99x (7 rounds, IQRs spanning 1): nothing measurable at inference there.

Imports only the standard library, torch and its flat sibling `host_measurements`: shipped to the
Hub beside the modeling files.
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
    if not in_float32:  # a float32 decoding step: eq. 1 as matmuls, no weights returned (as SDPA)

        def matmul_attention(module, query, key, value, attention_mask, **kwargs):
            return kernel(module, query, key, value, attention_mask, **kwargs)[0], None

        return matmul_attention

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
# The output projection of a decoding step through a prepacked oneDNN weight
# --------------------------------------------------------------------------------------------


class _PackedWeight:
    """A packed copy of one weight, valid for one decoding run: `scope` is a weak reference to the
    decoding cache of that `generate()` call (weights do not change while it runs)."""

    __slots__ = ("scope", "data_ptr", "packed")

    def __init__(self, weight: torch.Tensor, scope: object, packed: torch.Tensor | None):
        self.scope = weakref.ref(scope)
        self.data_ptr = weight.data_ptr()
        self.packed = packed  # None: packing failed, use F.linear

    def matches(self, weight: torch.Tensor, scope: object) -> bool:
        return self.scope() is scope and self.data_ptr == weight.data_ptr()


# Outside the modules, so deepcopy/pickling of a model never meets a packed (storage-less) tensor.
_PACKED: weakref.WeakKeyDictionary[nn.Linear, _PackedWeight] = weakref.WeakKeyDictionary()


def _packing_applies(hidden_states: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        not torch.is_grad_enabled()
        and hidden_states.device.type == "cpu"
        and weight.device.type == "cpu"
        and hidden_states.dtype == torch.float32
        and weight.dtype == torch.float32
        and hidden_states.numel() > 0
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


# Packing pays off for a run when packing once costs less than what this many decoding steps save
# (the mean Multi30k test2016 reference length in pieces + </s>, benchmark 3's forced length).
_PACKING_BREAK_EVEN_STEPS = 16
# Rows of the timed product: a batch of 64 sentences (greedy), benchmark 3's batch.
_PACKING_PROBE_ROWS = 64
# Packing inside a decoding run costs several times what the same packing costs when timed in a
# loop (each run packs into fresh memory): 5.5 ms per generate() in the profile of the Intel Xeon
# host against 1.1-1.9 ms timed alone. The timed cost is multiplied by this before comparing.
_PACKING_COST_FACTOR = 4.0
# Within-process memo of the packing decisions: (cpu, torch, threads, weight shape) -> bool.
_PACKING_DECISIONS: dict[tuple, bool] = {}


def _time_packing(weight: torch.Tensor, bias: torch.Tensor | None) -> dict:
    """Seconds to pack `weight`, and of one (64 × in) product through F.linear and the packed GEMM
    (medians of interleaved repeats; random inputs of the weight's shape and dtype)."""
    import statistics
    import time

    generator = torch.Generator().manual_seed(0)  # the global random state (a run's dropout) is not touched
    with torch.no_grad():
        w = torch.randn(weight.shape, dtype=weight.dtype, generator=generator)
        b = None if bias is None else torch.randn(bias.shape, dtype=bias.dtype, generator=generator)
        x = torch.randn(_PACKING_PROBE_ROWS, weight.size(1), dtype=weight.dtype, generator=generator)
        pack, plain, packed_step = [], [], []
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)  # warm-up of both kernels
        torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        F.linear(x, w, b)
        for _ in range(5):
            start = time.perf_counter()
            packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
            pack.append(time.perf_counter() - start)
            start = time.perf_counter()
            for _ in range(4):
                F.linear(x, w, b)
            plain.append((time.perf_counter() - start) / 4)
            start = time.perf_counter()
            for _ in range(4):
                torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
            packed_step.append((time.perf_counter() - start) / 4)
    return {
        "pack_s": round(statistics.median(pack), 6),
        "plain_step_s": round(statistics.median(plain), 6),
        "packed_step_s": round(statistics.median(packed_step), 6),
    }


def packing_pays_off(weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether prepacking `weight` for a decoding run is measured to save time on this machine.

    The packed GEMM is faster per step on the hosts measured, but packing is paid once per run:
    0.5 ms for the (8,000 × 256) output projection on a 2-core AMD EPYC (a step 2.68 → 1.24 ms),
    5.5 ms on a 2-core Intel Xeon with AMX (a step only 1.14x faster), where a 16-step greedy run of
    benchmark 3 came out 3-4% slower with packing (benchmarks/README.md). So the first use on a
    machine times packing and one (64 × in_features) product both ways, and packs only where
    packing, counted `_PACKING_COST_FACTOR` times (what it costs inside a run), costs less than
    `_PACKING_BREAK_EVEN_STEPS` steps save. The timing is kept per CPU,
    torch version, thread count and weight shape (`host_measurements`, `packed_linear.json`; also
    where this file ships as remote code) and in memory for the process.

    Args:
        weight: (out_features, in_features), float32 on the CPU.
        bias: (out_features,) or None.

    Returns:
        True to pack.
    """
    from .host_measurements import cpu_name, measured

    key = {
        "cpu": cpu_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": list(weight.shape),
        "bias": bias is not None,
        "rows": _PACKING_PROBE_ROWS,
    }
    memo = tuple(sorted((k, str(v)) for k, v in key.items()))
    if memo not in _PACKING_DECISIONS:
        entry, _, _ = measured("packed_linear.json", key, lambda: _time_packing(weight, bias))
        saved = _PACKING_BREAK_EVEN_STEPS * (entry["plain_step_s"] - entry["packed_step_s"])
        _PACKING_DECISIONS[memo] = _PACKING_COST_FACTOR * entry["pack_s"] < saved
    return _PACKING_DECISIONS[memo]


def packed_linear(hidden_states: torch.Tensor, layer: nn.Linear, scope: object | None) -> torch.Tensor:
    """`layer(hidden_states)`, through a prepacked-weight oneDNN GEMM during one decoding run.

    Applies only where autograd records nothing (`torch.no_grad()` / `torch.inference_mode()`,
    which `generate()` uses), to float32 CPU tensors outside autocast and `torch.compile`, with
    oneDNN enabled, on a machine where packing is measured to pay off (`packing_pays_off`);
    everything else takes the plain `layer(hidden_states)`.

    Args:
        hidden_states: (..., in_features).
        layer: the Linear layer (e.g. `lm_head`, d_model → vocab_size).
        scope: the decoding cache of the running `generate()` call (the same object at every
            step). The weight is packed at the first step of a run and reused until the run ends;
            a new run (a new cache) packs again, so weights updated between runs (training,
            `load_state_dict`, `.data` writes) are always seen. None: plain `layer(hidden_states)`.

    Returns:
        (..., out_features), equal to `layer(hidden_states)` up to float32 rounding.
    """
    weight, bias = layer.weight, layer.bias
    if scope is None or not _packing_applies(hidden_states, weight):
        return layer(hidden_states)
    entry = _PACKED.get(layer)
    if entry is None or not entry.matches(weight, scope):
        packed = None
        if packing_pays_off(weight, bias):
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            except RuntimeError:  # a build without this kernel
                packed = None
        entry = _PackedWeight(weight, scope, packed)
        _PACKED[layer] = entry
    if entry.packed is None:
        return layer(hidden_states)
    flat = hidden_states.reshape(-1, hidden_states.size(-1))
    try:
        output = torch.ops.mkldnn._linear_pointwise(flat, entry.packed, bias, "none", [], "")
    except RuntimeError:
        entry.packed = None
        return layer(hidden_states)
    return output.view(*hidden_states.shape[:-1], weight.size(0))


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


def fused_projection(hidden_states: torch.Tensor, projections: tuple[nn.Linear, ...], scope: object) -> torch.Tensor:
    """`modeling_transformer_seq2seq.fused_linear(hidden_states, *projections)` in a decoding step.

    The reference concatenates the weights at every call, which costs nothing next to a training
    batch's multiply but copies 3 · d_model² floats for each decoder layer at each decoding step,
    where the multiply has one row per sentence (64 × 256 rows against a 768 × 256 weight in
    benchmark 3). Here the concatenated weight is built at a run's first step and reused until the
    run ends (`scope`, the run's cache, as `packed_linear`); a new run concatenates again, so
    weights changed between runs are always seen. Applies where autograd records nothing (on any
    device); otherwise it concatenates as the reference does.

    Args:
        hidden_states: (batch, tgt_len, d_model).
        projections: Linear layers d_model → d_model with biases (`q_proj`, `k_proj`, `v_proj`).
        scope: the decoding cache of the running `generate()` call.

    Returns:
        (batch, tgt_len, len(projections) · d_model), the outputs side by side.
    """
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
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
# streaming several full-vocab float32 temporaries through memory (benchmarks/probe_loss_blocks.py;
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
    output_projection = staticmethod(packed_linear)
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
    "packed_linear",
    "packing_pays_off",
]
