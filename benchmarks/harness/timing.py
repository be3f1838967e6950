"""Timing and rates: statistics of repeated rounds (median and inter-quartile range), ratios
paired round by round, and the FLOP figures behind MFU (the step's FLOPs counted from the
dimensions, the matmul reference of the model's own GEMM shapes, the device's matmul peak).

Every benchmark interleaves its sides (A B B A ...) so that drifting machine load hits both alike;
numbers are medians over repeats with the spread given as the inter-quartile range.
"""

from __future__ import annotations

import statistics
import time

from harness.machine import sync
from harness.peers import TransformerDims


def summarize(values: list[float]) -> dict:
    """Median, inter-quartile range, min and max of a list of samples."""
    vals = sorted(values)
    if len(vals) >= 4:
        q = statistics.quantiles(vals, n=4)
        q1, q3 = q[0], q[2]
    else:
        q1, q3 = vals[0], vals[-1]
    return {"median": statistics.median(vals), "q1": q1, "q3": q3, "min": vals[0], "max": vals[-1], "n": len(vals)}


def paired_ratio_summary(ours_rates: list[float], peer_rates: list[float]) -> dict:
    """Ratios of rates paired round by round (robust to load drifting between rounds)."""
    return summarize([a / b for a, b in zip(ours_rates, peer_rates)])


# ----------------------------------------------------------------------------------------------
# FLOPs and matmul rates (MFU)
# ----------------------------------------------------------------------------------------------


def _seeded_randn(device: str, dtype):
    """randn(*shape) of a seeded generator, in `dtype` on `device`: drawn on the CPU and moved for
    a CPU (the numbers every earlier CPU measurement used), drawn on the GPU itself for a GPU (a
    CPU draw of a 16k x 8k tensor would cost the GPU check seconds per batch)."""
    import torch

    if str(device).startswith("cpu"):
        gen = torch.Generator().manual_seed(0)
        return lambda *shape: torch.randn(*shape, generator=gen).to(device, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    return lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype)


def peak_matmul_flops_per_s(device: str = "cpu", dtype=None, n: int = 8192, repeats: int = 10) -> dict:
    """The device's measured matmul peak: FLOP/s of an n x n x n product (2 n^3 FLOPs), the mean
    of `repeats` timed products after three warm-ups, on random data (zeros run faster on some
    GPUs). On the H200 an 8192^3 bf16 product gives about 790 TFLOP/s. MFU against this peak says
    how much of the chip a training step uses; MFU against `matmul_reference_flops_per_s` says how
    close it gets to its own (smaller) GEMM shapes.
    """
    import torch

    dtype = dtype or torch.float32
    randn = _seeded_randn(device, dtype)
    a, b = randn(n, n), randn(n, n)
    for _ in range(3):
        torch.matmul(a, b)
    sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    sync(device)
    seconds = time.perf_counter() - start
    return {
        "flops_per_s": 2.0 * n**3 * repeats / seconds,
        "n": n,
        "repeats": repeats,
        "dtype": str(dtype).replace("torch.", ""),
    }


def transformer_train_flops(dims: TransformerDims, stats: dict) -> float:
    """Training FLOPs of one step (forward + backward) counted from the dimensions.

    Multiply-adds count 2 FLOPs; backward costs twice the forward (grads w.r.t. inputs and
    weights), so a step is 3 x forward. Work is counted on the padded shapes the batch hands to
    the model (B x S source positions, B x T target positions), identical for both sides.

    forward, per layer (d = d_model, f = ffn):
      encoder self-attention projections   2 * B*S * 4*d^2        (q, k, v, out)
      encoder self-attention scores + mix  2 * 2 * B * S*S * d
      encoder feed-forward                 2 * B*S * 2*d*f
      decoder self-attention projections   2 * B*T * 4*d^2
      decoder causal scores + mix          2 * 2 * B * T*T * d    (full square: SDPA computes it)
      decoder cross-attention projections  2 * (B*T * 2*d^2 + B*S * 2*d^2)   (q, out; k, v)
      decoder cross scores + mix           2 * 2 * B * T*S * d
      decoder feed-forward                 2 * B*T * 2*d*f
    plus the output projection             2 * B*T * d*V
    Embedding look-ups, norms, softmax and the loss are left out (not matmuls).
    """
    d, f, V, L = dims.d_model, dims.ffn, dims.vocab_size, dims.layers
    B, S, T = stats["batch_size"], stats["src_len"], stats["tgt_len"]
    enc = L * (2 * B * S * 4 * d * d + 4 * B * S * S * d + 2 * B * S * 2 * d * f)
    dec = L * (
        2 * B * T * 4 * d * d
        + 4 * B * T * T * d
        + 2 * (B * T * 2 * d * d + B * S * 2 * d * d)
        + 4 * B * T * S * d
        + 2 * B * T * 2 * d * f
    )
    head = 2 * B * T * d * V
    return 3.0 * (enc + dec + head)


def matmul_reference_flops_per_s(
    dims: TransformerDims, stats: dict, repeats: int = 3, dtype=None, device: str = "cpu"
) -> dict:
    """FLOP/s torch.matmul reaches on the model's own GEMM shapes, forward and backward.

    For every linear layer of the model (M tokens x K in -> N out) we time the three GEMMs of its
    training step: Y = X W^T (M,K)x(K,N), dX = dY W (M,N)x(N,K), dW = dY^T X (N,M)x(M,K), each as
    many times as the model has such layers. The reference is total FLOPs / total time, i.e. what
    a perfect implementation built only from these matmuls would reach; MFU divides the model's
    achieved FLOP/s by it. The attention score/mix batched GEMMs are included the same way.
    `dtype` (default float32): torch.bfloat16 gives the reference of a bf16 mixed-precision step.
    `device`: where the products run (each group of them is timed between two synchronisations).
    """
    import torch

    dtype = dtype or torch.float32

    d, f, V, L, H = dims.d_model, dims.ffn, dims.vocab_size, dims.layers, dims.heads
    B, S, T = stats["batch_size"], stats["src_len"], stats["tgt_len"]
    hd = d // H
    shapes = [  # (count, M, K, N)
        (L * 4, B * S, d, d),
        (L, B * S, d, f),
        (L, B * S, f, d),  # encoder
        (L * 4, B * T, d, d),
        (L, B * T, d, f),
        (L, B * T, f, d),  # decoder self-attn + ffn
        (L * 2, B * T, d, d),
        (L * 2, B * S, d, d),  # cross-attention q/out and k/v
        (1, B * T, d, V),  # output projection
    ]
    bmm_shapes = [  # (count, batch, M, K, N): scores Q K^T and mix P V
        (L, B * H, S, hd, S),
        (L, B * H, S, S, hd),
        (L, B * H, T, hd, T),
        (L, B * H, T, T, hd),
        (L, B * H, T, hd, S),
        (L, B * H, T, S, hd),
    ]
    randn = _seeded_randn(device, dtype)
    ops = []
    for count, M, K, N in shapes:
        x, w, dy = randn(M, K), randn(N, K), randn(M, N)
        ops.append((count, 2.0 * M * K * N, lambda x=x, w=w: torch.matmul(x, w.t())))
        ops.append((count, 2.0 * M * K * N, lambda dy=dy, w=w: torch.matmul(dy, w)))
        ops.append((count, 2.0 * M * K * N, lambda dy=dy, x=x: torch.matmul(dy.t(), x)))
    for count, Bh, M, K, N in bmm_shapes:
        a, b, g = randn(Bh, M, K), randn(Bh, K, N), randn(Bh, M, N)
        ops.append((count, 2.0 * Bh * M * K * N, lambda a=a, b=b: torch.matmul(a, b)))
        ops.append((count, 2.0 * Bh * M * K * N, lambda g=g, b=b: torch.matmul(g, b.transpose(1, 2))))
        ops.append((count, 2.0 * Bh * M * K * N, lambda a=a, g=g: torch.matmul(a.transpose(1, 2), g)))
    for _, _, op in ops:  # warm-up
        op()
    sync(device)
    samples, flops_total, seconds_total = [], 0.0, 0.0
    for _ in range(repeats):
        total_flops, total_time = 0.0, 0.0
        for count, flops, op in ops:
            start = time.perf_counter()
            for _ in range(count):
                op()
            sync(device)
            total_time += time.perf_counter() - start
            total_flops += count * flops
        samples.append(total_flops / total_time)
        flops_total += total_flops
        seconds_total += total_time
    return {
        "flops_per_s": statistics.median(samples),
        "samples": samples,
        "flops": flops_total,
        "seconds": seconds_total,
    }
