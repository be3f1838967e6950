"""Benchmark 6: peak memory of one 4,000-token Transformer training batch, ours vs MarianMTModel.

Method (CPU). torch's CPU allocator keeps no statistics and tracemalloc does not see its
allocations, so we measure the process's resident memory from the kernel: every measurement is a
fresh subprocess per side that builds the model, the AdamW optimizer and one batch, then

  1. reads VmRSS (the baseline: interpreter, libraries, weights, the batch),
  2. resets the kernel's peak-RSS counter (writing "5" to /proc/self/clear_refs resets VmHWM),
  3. runs the training steps (forward, backward, AdamW step, zero_grad),
  4. reads VmHWM: the highest resident size reached during the steps.

Peak minus baseline is what the step added at its worst moment: activations kept for backward,
gradients, AdamW's two moment buffers (created by the first step) and temporaries. glibc is told
to return every block of 64 KiB or more to the kernel at free time (MALLOC_MMAP_THRESHOLD_=65536,
MALLOC_TRIM_THRESHOLD_=0), so RSS follows live tensors rather than the allocator's cache, and the
two sides are measured under identical allocator settings. Reported: the first step (includes
creating the optimizer state) and a steady-state step (the second one, measured from the RSS
just before it). A cross-check from inside torch: the profiler's allocator events of a third step
(every tensor allocation and free with its size) summed in time order give that step's peak of
live tensor bytes; on this machine it agrees with the RSS method within a few MiB. The batch is
the same on both sides: a token-budget batch of Multi30k train with about 4,000 padded tokens;
threads fixed.

    python benchmarks/bench_memory.py [--quick] [--repeats 3] [--threads 2]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harness.machine import base_argparser, log, set_threads
from harness.data import batch_stats, load_batches
from harness.peers import TransformerDims, build_marian, build_ours, count_params, make_train_step
from harness.timing import summarize
from harness.results import goal_entry, print_table, write_result

GOAL_RATIO = 1.0
BATCH_TOKENS = 4000
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_ARENA_MAX": "2"}


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def allocator_peak_bytes(step, batch) -> int:
    """Cross-check from inside torch: the profiler's allocator events ([memory] records, every
    tensor allocation and free with its size) of one more step, summed in time order; the maximum
    of the running sum is the step's peak of live tensor bytes above what was live before it."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step(batch)
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def measure_side(side: str, threads: int) -> dict:
    """Runs inside the per-side subprocess."""
    import gc

    set_threads(threads)
    dims = TransformerDims()
    _, batches = load_batches(BATCH_TOKENS, 1)
    batch = batches[0]
    model = build_ours(dims) if side == "ours" else build_marian(dims)
    step, _ = make_train_step(model)
    gc.collect()

    base_first = _status_kib("VmRSS")
    _reset_peak()
    step(batch)
    peak_first = _status_kib("VmHWM")
    gc.collect()

    base_steady = _status_kib("VmRSS")
    _reset_peak()
    step(batch)
    peak_steady = _status_kib("VmHWM")
    allocator_peak = allocator_peak_bytes(step, batch)
    return {
        "side": side,
        "params": count_params(model),
        "batch": batch_stats(batch),
        "baseline_rss_mib": base_first / 1024,
        "first_step_peak_over_baseline_mib": (peak_first - base_first) / 1024,
        "steady_step_peak_over_baseline_mib": (peak_steady - base_steady) / 1024,
        "first_step_peak_rss_mib": peak_first / 1024,
        "steady_step_allocator_peak_mib": allocator_peak / 2**20,
    }


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--side", choices=["ours", "marian"])
    args = parser.parse_args(argv)
    if args.side:
        print(json.dumps(measure_side(args.side, args.threads)))
        return {}
    repeats = args.repeats or (1 if args.quick else 3)
    set_threads(args.threads)
    load_batches(BATCH_TOKENS, 1)  # build the tokenizer cache before the subprocesses

    runs = {"ours": [], "marian": []}
    env = {**os.environ, **MALLOC_ENV}
    for r in range(repeats):
        for side in ["ours", "marian"] if r % 2 == 0 else ["marian", "ours"]:
            proc = subprocess.run(
                [sys.executable, __file__, "--side", side, "--threads", str(args.threads)],
                capture_output=True,
                text=True,
                env=env,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"{side} failed:\n{proc.stderr[-4000:]}")
            runs[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            log(
                f"repeat {r + 1}/{repeats} {side}: "
                f"first step +{runs[side][-1]['first_step_peak_over_baseline_mib']:.0f} MiB, "
                f"steady step +{runs[side][-1]['steady_step_peak_over_baseline_mib']:.0f} MiB"
            )

    keys = (
        "first_step_peak_over_baseline_mib",
        "steady_step_peak_over_baseline_mib",
        "baseline_rss_mib",
        "steady_step_allocator_peak_mib",
    )
    summary = {side: {k: summarize([run[k] for run in runs[side]]) for k in keys} for side in runs}
    ratio_first = summary["ours"][keys[0]]["median"] / summary["marian"][keys[0]]["median"]
    ratio_steady = summary["ours"][keys[1]]["median"] / summary["marian"][keys[1]]["median"]
    ratio_allocator = summary["ours"][keys[3]]["median"] / summary["marian"][keys[3]]["median"]
    rows = []
    for side in runs:
        s = summary[side]
        rows.append(
            [
                side,
                f"{s[keys[0]]['median']:.0f} [{s[keys[0]]['min']:.0f} – {s[keys[0]]['max']:.0f}]",
                f"{s[keys[1]]['median']:.0f} [{s[keys[1]]['min']:.0f} – {s[keys[1]]['max']:.0f}]",
                f"{s[keys[3]]['median']:.0f}",
                f"{s[keys[2]]['median']:.0f}",
            ]
        )
    rows.append(["ratio ours/marian", f"{ratio_first:.3f}x", f"{ratio_steady:.3f}x", f"{ratio_allocator:.3f}x", ""])
    batch = runs["ours"][0]["batch"]
    print_table(
        f"Peak memory of a training step, batch {batch['batch_size']} "
        f"x ({batch['src_len']} src, {batch['tgt_len']} tgt) "
        f"= {batch['src_padded']} padded source tokens, MiB above the pre-step RSS (median [min – max] of {repeats})",
        [
            "model",
            "RSS: first step (incl. AdamW state)",
            "RSS: steady-state step",
            "torch allocator: steady step",
            "baseline RSS",
        ],
        rows,
    )
    payload = {
        "description": (
            "peak RSS increase of a ~4,000-token training step (VmHWM after clear_refs), ours vs MarianMTModel"
        ),
        "method": "per-side subprocesses; VmRSS before, VmHWM after resetting it via /proc/self/clear_refs; glibc env "
        + json.dumps(MALLOC_ENV),
        "threads": args.threads,
        "repeats": repeats,
        "runs": runs,
        "summary": summary,
        "ratio_first_step": ratio_first,
        "ratio_steady_step": ratio_steady,
        "ratio_allocator_steady_step": ratio_allocator,
        "goals": [
            goal_entry("peak_memory_ratio_first_step", ratio_first, GOAL_RATIO, higher_is_better=False),
            goal_entry("peak_memory_ratio_steady_step", ratio_steady, GOAL_RATIO, higher_is_better=False),
            goal_entry("peak_memory_ratio_allocator", ratio_allocator, GOAL_RATIO, higher_is_better=False),
        ],
    }
    write_result("memory", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
