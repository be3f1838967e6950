"""Probe: which of our CPU inference paths help greedy `generate` on this host (issue 31, item 5).

Benchmark 3's setup (bench_generate.py: same dimensions, fresh weights, Multi30k test2016 sources
in file order, batches of 64, exactly N new tokens, no `</s>`), with our model run in variants
that each switch one CPU path off, all interleaved batch by batch with MarianMTModel (the order
rotating), so each variant's ratio to Marian is paired within the same moments of machine load:

- ``all``: the defaults (every path on);
- ``no-fused-weight``: Q, K, V projected by calling each layer, as the reference does
  (`cpu_fast_paths.fused_projection` off);
- ``no-padfree``: the encoder on the padded batch (no `PaddingFreeLayout`);
- ``no-matmul-step``: SDPA for the decoding steps' attention instead of two matmuls
  (`_DECODE_STEP_MAX_QUERIES` = 0);
- ``none``: all of them off.

    python benchmarks/probes/probe_cpu_paths.py [--threads 2] [--rounds 3] [--sentences 320]

Prints the host, each variant's sentences/s and its ratio to Marian (median over rounds of the
per-round ratios); writes results/probe_cpu_paths_<host>.json.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness, the benchmarks

from harness.machine import base_argparser, cpu_model, log, set_threads
from harness.data import test2016_translation_setup
from harness.peers import TransformerDims, build_marian, build_ours
from harness.results import write_result

VARIANTS = ("all", "no-fused-weight", "no-padfree", "no-matmul-step", "none")


@contextlib.contextmanager
def variant(name: str):
    """Switch one fast path off (through the seam's class, `CPUFastPaths`) while the block runs."""
    from attention_seq2seq.modeling import cpu_fast_paths as fast

    paths = fast.CPUFastPaths
    names = ("fused_projection", "padding_free_layout")
    saved = {n: paths.__dict__[n] for n in names}, fast._DECODE_STEP_MAX_QUERIES
    off = name == "none"
    if off or name == "no-fused-weight":
        paths.fused_projection = staticmethod(lambda hidden_states, projections, scope=None: None)
    if off or name == "no-padfree":
        paths.padding_free_layout = staticmethod(lambda attention_mask: None)
    if off or name == "no-matmul-step":
        fast._DECODE_STEP_MAX_QUERIES = 0
    try:
        yield
    finally:
        for n, method in saved[0].items():
            setattr(paths, n, method)
        fast._DECODE_STEP_MAX_QUERIES = saved[1]


def main(argv=None) -> dict:
    import statistics

    import torch
    from bench_generate import generation_config

    parser = base_argparser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    dims = TransformerDims()
    tokenizer, test_sources, new_tokens = test2016_translation_setup(dims)
    sources = test_sources[: args.sentences]
    batches = [
        tokenizer(sources[i : i + args.batch_size], padding=True, return_tensors="pt")
        for i in range(0, len(sources), args.batch_size)
    ]
    ours, marian = build_ours(dims).eval(), build_marian(dims).eval()
    for model in (ours, marian):
        model.generation_config.eos_token_id = None
    config = generation_config(1, new_tokens)
    sides = ["marian", *VARIANTS]

    def run(side: str, batch) -> None:
        model = marian if side == "marian" else ours
        with variant("all" if side == "marian" else side), torch.inference_mode():
            out = model.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], generation_config=config
            )
        assert out.shape[1] == new_tokens + 1

    for side in sides:  # warm-up
        run(side, batches[0])
    seconds = {side: [] for side in sides}
    for r in range(args.rounds):
        spent = dict.fromkeys(sides, 0.0)
        for i, batch in enumerate(batches):
            shift = (r * len(batches) + i) % len(sides)
            for side in sides[shift:] + sides[:shift]:  # rotate the order batch by batch
                start = time.perf_counter()
                run(side, batch)
                spent[side] += time.perf_counter() - start
        for side in sides:
            seconds[side].append(spent[side])
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{s} {len(sources) / spent[s]:.1f}" for s in sides))
    results = {}
    for side in sides:
        ratios = [m / s for m, s in zip(seconds["marian"], seconds[side])]  # speed(side) / speed(marian)
        results[side] = {
            "sentences_per_s_median": statistics.median(len(sources) / s for s in seconds[side]),
            "ratio_over_marian_median": statistics.median(ratios),
            "ratios": ratios,
        }
    host = cpu_model()
    print(
        f"host: {host}; {threads} threads; {len(sources)} sentences, batch {args.batch_size}, "
        f"{new_tokens} new tokens, {args.rounds} rounds (paired, interleaved)"
    )
    for side in sides:
        res = results[side]
        print(
            f"  {side:15s} {res['sentences_per_s_median']:7.1f} sent/s   ratio/marian "
            f"{res['ratio_over_marian_median']:.3f}  ({', '.join(f'{x:.3f}' for x in res['ratios'])})"
        )
    payload = {
        "host": host,
        "threads": threads,
        "sentences": len(sources),
        "rounds": args.rounds,
        "new_tokens": new_tokens,
        "results": results,
    }
    write_result("probe_cpu_paths_custom", payload, False)
    return payload


if __name__ == "__main__":
    main()
