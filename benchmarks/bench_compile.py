"""Benchmark: `torch.compile`d decoding with the static cache against eager decoding, ours and
MarianMTModel, paired in one run.

transformers compiles a model's decoding step inside `generate` when the model says it can
(`_can_compile_fullgraph`) and the cache is static (`cache_implementation="static"`); on a CPU
only when the `CompileConfig` asks for it (`_compile_all_devices=True`). This times four sides on
the same batches, the order rotating from batch to batch so that each side meets the same moments
of machine load:

- `ours eager`: our Transformer, the default dynamic cache, no compilation;
- `ours static+compile`: the static cache and the compiled decoding step (inductor, fullgraph);
- `marian eager`, `marian static+compile`: the same for a MarianMTModel of the same size.

Same setup as benchmark 3 (bench_generate.py: `harness.peers.TransformerDims`, fresh weights, Multi30k
test2016 sources, exactly N new tokens with no `</s>`), except that every batch has the same
shape (`--sentences` cut to whole batches, sources padded to one length), since each new shape
would compile again. Compilation happens in the warm-up and is reported apart. Both sides of a
model must produce the same tokens (checked on every batch).

Reported: sentences/s per side (median over rounds) and, per model, static+compile / eager
(paired per round). Not in run_all: compiling takes minutes on a CPU.

    python benchmarks/bench_compile.py [--quick] [--threads 2] [--rounds 3] [--sentences 256] [--beams 1]
"""

from __future__ import annotations

import time

from harness.machine import base_argparser, log, set_threads
from harness.data import test2016_translation_setup
from harness.peers import TransformerDims, build_marian, build_ours
from harness.timing import paired_ratio_summary, summarize
from harness.results import print_table, write_result


def main(argv=None) -> dict:
    import torch
    from bench_generate import generation_config
    from transformers import CompileConfig

    parser = base_argparser(__doc__)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--sentences", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beams", type=int, default=1)
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    batch_size = 8 if args.quick else args.batch_size
    n_sentences = args.sentences or (16 if args.quick else 256)
    n_sentences = max(batch_size, n_sentences // batch_size * batch_size)
    threads = set_threads(args.threads)

    dims = TransformerDims()
    tokenizer, test_sources, new_tokens = test2016_translation_setup(dims)
    sources = test_sources[:n_sentences]
    source_len = max(len(ids) for ids in tokenizer(sources)["input_ids"])
    batches = [
        tokenizer(sources[i : i + batch_size], padding="max_length", max_length=source_len, return_tensors="pt")
        for i in range(0, len(sources), batch_size)
    ]
    models = {"ours": build_ours(dims).eval(), "marian": build_marian(dims).eval()}
    for model in models.values():
        model.generation_config.eos_token_id = None
        assert type(model)._can_compile_fullgraph, f"{type(model).__name__} does not declare _can_compile_fullgraph"
    eager = generation_config(args.beams, new_tokens)
    compiled = generation_config(args.beams, new_tokens)
    compiled.cache_implementation = "static"
    compiled.compile_config = CompileConfig(fullgraph=True, dynamic=False, mode="default")
    compiled.compile_config._compile_all_devices = True  # a class attribute, not a field: CPUs compile only so
    sides = {f"{m} {s}": (m, c) for m in models for s, c in (("eager", eager), ("static+compile", compiled))}
    log(
        f"{len(sources)} sentences in {len(batches)} batches of {batch_size} (sources padded to {source_len}), "
        f"{new_tokens} new tokens, beams {args.beams}; cpu, threads={threads}"
    )

    def translate(side: str, batch) -> torch.Tensor:
        name, config = sides[side]
        with torch.inference_mode():
            return models[name].generate(**batch, generation_config=config)

    warmup = {}
    for side in sides:  # compilation happens here
        start = time.perf_counter()
        translate(side, batches[0])
        warmup[side] = time.perf_counter() - start
        log(f"warm-up {side}: {warmup[side]:.1f} s")
    seconds = {side: [] for side in sides}
    order = list(sides)
    for r in range(rounds):
        spent = dict.fromkeys(sides, 0.0)
        for i, batch in enumerate(batches):
            shift = (r * len(batches) + i) % len(order)
            outputs = {}
            for side in order[shift:] + order[:shift]:
                start = time.perf_counter()
                outputs[side] = translate(side, batch)
                spent[side] += time.perf_counter() - start
            for name in models:
                assert torch.equal(outputs[f"{name} eager"], outputs[f"{name} static+compile"]), name
        for side in sides:
            seconds[side].append(spent[side])
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{s} {len(sources) / seconds[s][-1]:.1f} sent/s" for s in sides))
    rates = {side: [len(sources) / s for s in seconds[side]] for side in sides}
    ratios = {name: paired_ratio_summary(rates[f"{name} static+compile"], rates[f"{name} eager"]) for name in models}
    rows = [
        [
            side,
            f"{summarize(rates[side])['median']:.1f}",
            f"{warmup[side]:.1f}",
            f"{ratios[sides[side][0]]['median']:.3f}x" if side.endswith("compile") else "",
        ]
        for side in sides
    ]
    print_table(
        f"Compiled static-cache decoding vs eager, {len(sources)} Multi30k test2016 sources, {new_tokens} tokens, "
        f"beams {args.beams}, batch {batch_size}, {threads} threads",
        ["side", "sent/s (median)", "first batch s (compile)", "static+compile / eager"],
        rows,
    )
    payload = {
        "description": "generate() with the static cache and torch.compile vs eager, ours and MarianMTModel",
        "dims": dims,
        "threads": threads,
        "sentences": len(sources),
        "batch_size": batch_size,
        "source_len": source_len,
        "new_tokens": new_tokens,
        "num_beams": args.beams,
        "warmup_seconds": warmup,
        "seconds_per_round": seconds,
        "sentences_per_s": {side: summarize(rates[side]) for side in sides},
        "ratio_static_compile_over_eager": ratios,
    }
    write_result("compile_static_cache", payload, args.quick or bool(args.rounds or args.sentences))
    return payload


if __name__ == "__main__":
    main()
