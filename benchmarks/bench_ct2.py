"""Benchmark 3b: CTranslate2 (int8, float32) against our PyTorch `generate` and Marian, greedy and
beam 5, with the BLEU of each on Multi30k test2016 from the same trained model.

Speed, as benchmark 3 (bench_generate.py): the Multi30k test2016 German sources in file order,
batches of 64, every sentence forced to exactly N new tokens, N the mean reference length (pieces
+ `</s>`, with the trained model's tokenizer) rounded up. PyTorch sides (ours, the trained model;
Marian, `MarianMTModel` of the same dimensions with random weights, speed only) decode with
`eos_token_id=None` and `max_new_tokens=N` (benchmark 3's `no-eos`); CTranslate2 has no switch to
drop `</s>`, so its sides get `min_decoding_length = max_decoding_length = N` (it masks `</s>`
inside its decoding loop until step N). Each round translates every batch on all sides back to
back, the order rotating from batch to batch; reported: sentences/s (median and IQR over rounds)
and each side's ratio to ours, paired per round.

Every side runs in its own worker process (this script with ``--worker SIDE``), as a user runs one
backend: CTranslate2's OpenMP runtime and PyTorch's spin-wait after their parallel regions, and
in one process they slowed each other (on the 2-core Intel Xeon of 2026-12-02 our `generate`
ran at 0.59x of its own speed beside a loaded CTranslate2). The parent sends "translate batch i
with k beams" and the worker answers with the seconds it spent, timed inside the worker (the
pipe is not timed), after a pause of `--gap-ms` (20 ms) in which the previous side's OpenMP threads
stop spin-waiting. The CTranslate2 sides load as `translate -m` does (`load_ct2`): the default
thread layout, "inter" (`ATTENTION_SEQ2SEQ_CT2_THREADS=intra` times the other); with "inter" a
batch of 64 goes to CTranslate2 as `64 / threads` sentences per sub-batch, decoded side by side,
the way `translate` hands it a chunk.

Quality: the whole test2016 (1,000 sentences) translated normally (stopping at `</s>`, the model's
`max_new_tokens`), greedy and beam 5, by ours, the native transformers export of the same model
(`export --format native`) and both CTranslate2 exports, scored with sacreBLEU; also how many
lines each gives identically to ours.

    python benchmarks/bench_ct2.py --run runs/multi30k-transformer-small [--threads 2] [--rounds 5]
                                   [--sentences 1000] [--beams 1 5] [--skip-quality]

A run with fewer rounds or sentences than the defaults writes results/ct2_custom.json.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from harness.machine import base_argparser, cpu_model, log, set_threads
from harness.data import read_pairs
from harness.peers import TransformerDims, build_marian
from harness.timing import paired_ratio_summary, summarize
from harness.workers import WorkerSide, serve
from harness.results import fmt, print_table, spread, write_result

SIDES = ("ours", "marian", "ct2-float32", "ct2-int8")


def _exports(run: Path, folder: Path) -> dict[str, Path]:
    from attention_seq2seq.hub.export_ct2 import export_ct2
    from attention_seq2seq.hub.export_native import export_native

    paths = {"native": folder / "native", "ct2-float32": folder / "ct2-float32", "ct2-int8": folder / "ct2-int8"}
    export_native(run, paths["native"])
    export_ct2(run, paths["ct2-float32"], quantization="float32")
    export_ct2(run, paths["ct2-int8"], quantization="int8")
    return paths


def quality(run: Path, paths: dict[str, Path], pairs, beams_list, threads: int) -> dict:
    """BLEU/chrF of each backend on the whole test set, and lines identical to ours."""
    from attention_seq2seq.translation.loading import load_for_inference, translate
    from attention_seq2seq.translation.ct2 import load_ct2
    from attention_seq2seq.translation.loading import LoadedModel, ModelLocation
    from attention_seq2seq.translation.scores import corpus_scores

    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    loaded = {
        "ours": load_for_inference(run, device="cpu"),
        "native": load_for_inference(paths["native"], device="cpu"),
    }
    for name in ("ct2-float32", "ct2-int8"):
        model, tokenizer = load_ct2(paths[name], device="cpu", threads=threads)
        loaded[name] = LoadedModel(
            model=model, tokenizer=tokenizer, location=ModelLocation(str(paths[name]), "ctranslate2")
        )
    results = {}
    for beams in beams_list:
        mode = "greedy" if beams == 1 else f"beam{beams}"
        hypotheses = {}
        for name, model in loaded.items():
            start = time.perf_counter()
            hypotheses[name] = translate(model, sources, batch_size=64, num_beams=beams)
            log(f"quality {mode} {name}: {time.perf_counter() - start:.1f} s")
        results[mode] = {}
        for name, hyps in hypotheses.items():
            scores = corpus_scores(hyps, references, target_lang="en")
            differing = [i for i, (a, b) in enumerate(zip(hyps, hypotheses["ours"])) if a != b]
            results[mode][name] = {
                "bleu": scores["bleu"], "chrf": scores["chrf"], "identical_to_ours": len(sources) - len(differing),
                "differing_lines": differing[:50],
            }  # fmt: skip
    return results


WORKER_ARGS = ("run", "folder", "threads", "batch_size", "sentences", "new_tokens")


def _worker(args) -> None:
    """One side in its own process: load it, then answer "BEAMS INDEX" lines with the seconds that
    translating batch INDEX took (one JSON line each); "quit" ends it."""

    import torch

    set_threads(args.threads)
    from attention_seq2seq.translation.loading import load_for_inference

    ours = load_for_inference(Path(args.run), device="cpu")
    tokenizer, side = ours.tokenizer, args.worker
    sources = [s for s, _ in read_pairs("test2016")][: args.sentences]
    chunks = [sources[i : i + args.batch_size] for i in range(0, len(sources), args.batch_size)]
    info = {"side": side}
    if side in ("ours", "marian"):
        from bench_generate import generation_config

        config = ours.model.config
        model = ours.model
        if side == "marian":
            model = build_marian(TransformerDims.from_config(config)).eval()
        model.generation_config.eos_token_id = None
        batches = [tokenizer(chunk, padding=True, return_tensors="pt") for chunk in chunks]

        def translate(i: int, beams: int) -> None:
            with torch.inference_mode():
                out = model.generate(
                    input_ids=batches[i]["input_ids"],
                    attention_mask=batches[i]["attention_mask"],
                    generation_config=generation_config(beams, args.new_tokens, "no-eos"),
                )
            assert out.shape[1] == args.new_tokens + 1, (side, tuple(out.shape))

        info["threads"] = torch.get_num_threads()
    else:
        from attention_seq2seq.translation.ct2 import load_ct2

        ct2_model, _ = load_ct2(Path(args.folder) / side, device="cpu", threads=args.threads)
        layout = ct2_model.thread_layout
        token_batches = [[tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(c)["input_ids"]] for c in chunks]
        sub_batch = max(1, -(-args.batch_size // layout.inter_threads))

        def translate(i: int, beams: int) -> None:
            out = ct2_model.translator.translate_batch(
                token_batches[i],
                beam_size=beams,
                max_batch_size=sub_batch,
                min_decoding_length=args.new_tokens,
                max_decoding_length=args.new_tokens,
                patience=1,
                return_scores=False,  # as the PyTorch sides, which return no scores either
            )
            assert all(len(r.hypotheses[0]) == args.new_tokens for r in out), side

        info.update(intra_threads=layout.intra_threads, inter_threads=layout.inter_threads, layout=layout.reason,
                    sub_batch=sub_batch)  # fmt: skip
    serve(translate, info)


def _side(name: str, args, folder: Path, new_tokens: int, n_sentences: int) -> WorkerSide:
    """A worker process serving side ``name`` (this script with ``--worker NAME``)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--run", str(args.run),
               "--folder", str(folder), "--threads", str(args.threads), "--batch-size", str(args.batch_size),
               "--sentences", str(n_sentences), "--new-tokens", str(new_tokens)]  # fmt: skip
    return WorkerSide(name, command)


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--run", required=True, help="training output folder of a Transformer (benchmark 3's dims)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--sentences", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--skip-quality", action="store_true", help="speed only")
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=20.0,
        help="pause between two sides' batches (not timed), so that the OpenMP threads of the side that just "
        "finished stop spin-waiting before the next side's clock starts",
    )
    parser.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--new-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    rounds = args.rounds or (2 if args.quick else 5)
    n_sentences = args.sentences or (32 if args.quick else 1000)
    args.batch_size = min(args.batch_size, 16) if args.quick else args.batch_size
    batch_size = args.batch_size
    threads = args.threads
    from attention_seq2seq.translation.loading import load_for_inference

    run = Path(args.run)
    loaded = load_for_inference(run, device="cpu")
    tokenizer, config = loaded.tokenizer, loaded.model.config
    dims = TransformerDims.from_config(config)
    pairs = read_pairs("test2016")
    ref_lengths = [len(ids) for ids in tokenizer([t for _, t in pairs])["input_ids"]]
    new_tokens = math.ceil(sum(ref_lengths) / len(ref_lengths))
    sources = [s for s, _ in pairs][:n_sentences]
    n_batches = math.ceil(len(sources) / batch_size)
    folder = Path(tempfile.mkdtemp(prefix="bench_ct2_"))
    paths = _exports(run, folder)
    sides = {name: _side(name, args, folder, new_tokens, len(sources)) for name in SIDES}
    log(
        f"{len(sources)} sentences in batches of {batch_size}, {new_tokens} new tokens each; threads={threads}; "
        f"host {cpu_model()}; one process per side: {[s.info for s in sides.values()]}"
    )
    results = {}
    for beams in args.beams:
        seconds = {name: [] for name in SIDES}
        for r in range(rounds):
            spent = {name: 0.0 for name in SIDES}
            for i in range(n_batches):
                shift = (r + i) % len(SIDES)
                for name in SIDES[shift:] + SIDES[:shift]:
                    time.sleep(args.gap_ms / 1000)  # the previous side's threads stop spinning (not timed)
                    spent[name] += sides[name].translate(beams, i)
            for name in SIDES:
                seconds[name].append(spent[name])
            log(
                f"beam {beams} round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {len(sources) / seconds[n][-1]:.1f} sent/s" for n in SIDES)
            )
        rates = {name: [len(sources) / s for s in seconds[name]] for name in SIDES}
        mode = "greedy" if beams == 1 else f"beam{beams}"
        results[mode] = {
            "num_beams": beams,
            "seconds_per_round": seconds,
            "sentences_per_s": {name: summarize(rates[name]) for name in SIDES},
            "ratio_over_ours": {name: paired_ratio_summary(rates[name], rates["ours"]) for name in SIDES[1:]},
        }
    for side in sides.values():
        side.close()
    quality_results = None
    if not args.skip_quality:
        quality_results = quality(run, paths, pairs, args.beams, threads)

    rows = []
    for mode, res in results.items():
        for name in SIDES:
            s = res["sentences_per_s"][name]
            ratio = "1.000x" if name == "ours" else f"{res['ratio_over_ours'][name]['median']:.3f}x"
            q = (quality_results or {}).get(mode, {}).get(name)
            bleu = "n/a (random weights)" if name == "marian" else (fmt(q["bleu"], 2) if q else "-")
            same = f"{q['identical_to_ours']}/{len(pairs)}" if q else "-"
            rows.append([mode, name, fmt(s["median"], 1), spread(s, 1), ratio, bleu, same])
        if quality_results and "native" in quality_results.get(mode, {}):
            q = quality_results[mode]["native"]
            rows.append(
                [mode, "native export", "-", "-", "-", fmt(q["bleu"], 2), f"{q['identical_to_ours']}/{len(pairs)}"]
            )
    print_table(
        f"Translation, {len(sources)} Multi30k test2016 sources, {new_tokens} tokens each, batch {batch_size}, "
        f"{threads} threads; BLEU on all {len(pairs)} sentences",
        ["mode", "backend", "sent/s (median)", "IQR", "ratio to ours", "BLEU test2016", "lines = ours"],
        rows,
    )
    payload = {
        "description": "CTranslate2 int8/float32 vs our generate and Marian: sentences/s with forced length, and BLEU",
        "run": str(run),
        "dims": dims,
        "threads": threads,
        "rounds": rounds,
        "sentences": len(sources),
        "batch_size": batch_size,
        "new_tokens_per_sentence": new_tokens,
        "workers": {name: side.info for name, side in sides.items()},
        "gap_ms": args.gap_ms,
        "results": results,
        "quality": quality_results,
    }
    shutil.rmtree(folder, ignore_errors=True)  # the temporary exports
    custom = not args.quick and (rounds != 5 or len(sources) != len(pairs))
    write_result("ct2" + ("_custom" if custom else ""), payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
