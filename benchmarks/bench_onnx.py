"""Benchmark 3c: the ONNX export (onnxruntime, float32 and int8) against our PyTorch `generate`
and, for a Transformer, CTranslate2 (float32, int8): greedy and beam 5, with the BLEU of each on
a test set from the same trained model. Either family (the RNN has no CTranslate2 side).

Speed, as benchmark 3b (bench_ct2.py): the test sources in file order, batches of
`--batch-size`, every sentence forced to exactly N new tokens, N the mean reference length
(pieces + `</s>`) rounded up: PyTorch with `eos_token_id=None, max_new_tokens=N`; onnxruntime
with `min_new_tokens = max_new_tokens = N` (`</s>` masked until step N, transformers'
`MinNewTokensLengthLogitsProcessor`); CTranslate2 with `min_decoding_length =
max_decoding_length = N`. One worker process per side (as a user runs one backend), batches
rotating over the sides, `--gap-ms` between sides (not timed); sentences/s per round, median and
IQR, and each side's ratio to ours paired per round. The ONNX and CTranslate2 sides load as
`translate -m` loads them, with the thread layout each measures for this host (with "inter" a
batch goes out as `threads` sub-batches decoded side by side).

Quality: the whole test set translated normally (stopping at `</s>`, the model's
`max_new_tokens`) by every side through the translation engine, greedy and beam 5, scored with
sacreBLEU; and how many lines each gives identically to ours, with the first differing lines.

    python benchmarks/bench_onnx.py --run runs/bible-rnn-luong --src test.es --ref test.en
                                    [--threads 2] [--rounds 3] [--beams 1 5] [--skip-quality]

Writes results/onnx_<model_type>.json.
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
from harness.results import fmt, print_table, spread, write_result
from harness.timing import paired_ratio_summary, summarize
from harness.workers import WorkerSide, serve


def _lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def sides_for(model_type: str) -> tuple[str, ...]:
    onnx = ("ours", "onnx-float32", "onnx-int8")
    return onnx if model_type == "rnn_seq2seq" else onnx + ("ct2-float32", "ct2-int8")


def _exports(run: Path, folder: Path, sides, check_sentences: list[str]) -> dict[str, Path]:
    from attention_seq2seq.hub.export_onnx import export_onnx

    paths = {}
    for side in sides[1:]:
        kind, quantization = side.split("-")
        paths[side] = folder / side
        if kind == "onnx":
            export_onnx(run, paths[side], quantization=quantization, sentences=check_sentences)
        else:
            from attention_seq2seq.hub.export_ct2 import export_ct2

            export_ct2(run, paths[side], quantization=quantization)
    return paths


def _load(side: str, run: Path, folder: Path):
    from attention_seq2seq.translation.loading import load_for_inference

    return load_for_inference(run if side == "ours" else folder / side, device="cpu")


def _worker(args) -> None:
    """One side in its own process: answers "BEAMS INDEX" lines with the seconds batch INDEX took."""
    import torch

    set_threads(args.threads)
    loaded = _load(args.worker, Path(args.run), Path(args.folder))
    tokenizer, side, n = loaded.tokenizer, args.worker, args.new_tokens
    sources = _lines(args.src)[: args.sentences]
    chunks = [sources[i : i + args.batch_size] for i in range(0, len(sources), args.batch_size)]
    info = {"side": side}
    if side == "ours":
        model = loaded.model
        model.generation_config.eos_token_id = None
        batches = [tokenizer(chunk, padding=True, return_tensors="pt") for chunk in chunks]

        def translate(i: int, beams: int) -> None:
            with torch.inference_mode():
                out = model.generate(**batches[i], num_beams=beams, max_new_tokens=n, do_sample=False)
            assert out.shape[1] == n + 1, tuple(out.shape)

        info["threads"] = torch.get_num_threads()
    elif side.startswith("onnx"):
        from attention_seq2seq.translation.onnx_backend import _run_batches

        runner, workers = loaded.model.runner, loaded.model.threads if loaded.model.thread_layout == "inter" else 1
        rows = [tokenizer(chunk)["input_ids"] for chunk in chunks]
        sub = max(1, -(-args.batch_size // workers))

        def translate(i: int, beams: int) -> None:
            parts = [rows[i][k : k + sub] for k in range(0, len(rows[i]), sub)]
            found = _run_batches(runner, parts, workers, num_beams=beams, min_new_tokens=n, max_new_tokens=n)
            assert all(len(h[0].tokens) == n for part in found for h in part), side

        info.update(layout=loaded.model.thread_layout, reason=loaded.model.layout_reason, sub_batch=sub)
    else:
        ct2, layout = loaded.model, loaded.model.thread_layout
        token_batches = [[tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(c)["input_ids"]] for c in chunks]
        sub = max(1, -(-args.batch_size // layout.inter_threads))

        def translate(i: int, beams: int) -> None:
            out = ct2.translator.translate_batch(
                token_batches[i], beam_size=beams, max_batch_size=sub, min_decoding_length=n,
                max_decoding_length=n, patience=1, return_scores=False,
            )  # fmt: skip
            assert all(len(r.hypotheses[0]) == n for r in out), side

        info.update(layout=layout.reason, sub_batch=sub)
    serve(translate, info)


def _side(name: str, args, folder: Path, new_tokens: int, n_sentences: int) -> WorkerSide:
    """A worker process serving side ``name`` (this script with ``--worker NAME``)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--run", str(args.run),
               "--folder", str(folder), "--threads", str(args.threads), "--batch-size", str(args.batch_size),
               "--sentences", str(n_sentences), "--new-tokens", str(new_tokens), "--src", args.src,
               "--ref", args.ref]  # fmt: skip
    return WorkerSide(name, command)


def quality(run: Path, folder: Path, sides, sources, references, beams_list, batch_size: int) -> dict:
    """BLEU/chrF of each side on the whole test set, and lines identical to ours."""
    from attention_seq2seq.translation.loading import translate
    from attention_seq2seq.translation.scores import corpus_scores

    results = {}
    for beams in beams_list:
        mode = "greedy" if beams == 1 else f"beam{beams}"
        hypotheses = {}
        for side in sides:
            loaded = _load(side, run, folder)
            start = time.perf_counter()
            hypotheses[side] = translate(loaded, sources, batch_size=batch_size, num_beams=beams)
            log(f"quality {mode} {side}: {time.perf_counter() - start:.1f} s")
        results[mode] = {}
        for side, hyps in hypotheses.items():
            scores = corpus_scores(hyps, references, target_lang="en")
            differing = [i for i, (a, b) in enumerate(zip(hyps, hypotheses["ours"])) if a != b]
            results[mode][side] = {
                "bleu": scores["bleu"], "chrf": scores["chrf"], "identical_to_ours": len(sources) - len(differing),
                "differing_lines": [
                    {"line": i + 1, "ours": hypotheses["ours"][i], side: hyps[i]} for i in differing[:20]
                ],
            }  # fmt: skip
    return results


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--run", required=True, help="training output folder (either family)")
    parser.add_argument("--src", required=True, help="test sources, one per line")
    parser.add_argument("--ref", required=True, help="test references, line-aligned")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=None, help="speed: the first N sources (default: all)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--skip-quality", action="store_true", help="speed only")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="pause between two sides' batches (not timed)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--new-tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    from attention_seq2seq.translation.loading import load_for_inference

    run = Path(args.run)
    loaded = load_for_inference(run, device="cpu")
    model_type = loaded.model.config.model_type
    sides = sides_for(model_type)
    sources, references = _lines(args.src), _lines(args.ref)
    lengths = [len(ids) for ids in loaded.tokenizer(references)["input_ids"]]
    new_tokens = math.ceil(sum(lengths) / len(lengths))
    n_sentences = min(args.sentences or len(sources), len(sources))
    n_batches = math.ceil(n_sentences / args.batch_size)
    folder = Path(tempfile.mkdtemp(prefix="bench_onnx_"))
    _exports(run, folder, sides, sources[:16])
    workers = {name: _side(name, args, folder, new_tokens, n_sentences) for name in sides}
    log(
        f"{n_sentences} sentences in batches of {args.batch_size}, {new_tokens} new tokens each; threads="
        f"{args.threads}; host {cpu_model()}; workers: {[w.info for w in workers.values()]}"
    )
    results = {}
    for beams in args.beams:
        seconds = {name: [] for name in sides}
        for r in range(args.rounds):
            spent = {name: 0.0 for name in sides}
            for i in range(n_batches):
                shift = (r + i) % len(sides)
                for name in sides[shift:] + sides[:shift]:
                    time.sleep(args.gap_ms / 1000)
                    spent[name] += workers[name].translate(beams, i)
            for name in sides:
                seconds[name].append(spent[name])
            log(
                f"beam {beams} round {r + 1}: "
                + ", ".join(f"{n} {n_sentences / seconds[n][-1]:.1f} sent/s" for n in sides)
            )
        rates = {name: [n_sentences / s for s in seconds[name]] for name in sides}
        results["greedy" if beams == 1 else f"beam{beams}"] = {
            "num_beams": beams,
            "seconds_per_round": seconds,
            "sentences_per_s": {name: summarize(rates[name]) for name in sides},
            "ratio_over_ours": {name: paired_ratio_summary(rates[name], rates["ours"]) for name in sides[1:]},
        }
    for worker in workers.values():
        worker.close()
    quality_results = None
    if not args.skip_quality:
        quality_results = quality(run, folder, sides, sources, references, args.beams, args.batch_size)
    rows = []
    for mode, res in results.items():
        for name in sides:
            s = res["sentences_per_s"][name]
            ratio = "1.000x" if name == "ours" else f"{res['ratio_over_ours'][name]['median']:.3f}x"
            q = (quality_results or {}).get(mode, {}).get(name)
            rows.append([mode, name, fmt(s["median"], 1), spread(s, 1), ratio, fmt(q["bleu"], 2) if q else "-",
                         f"{q['identical_to_ours']}/{len(sources)}" if q else "-"])  # fmt: skip
    print_table(
        f"{model_type}: {n_sentences} test sources, {new_tokens} tokens each, batch {args.batch_size}, "
        f"{args.threads} threads; BLEU on all {len(sources)} sentences",
        ["mode", "backend", "sent/s (median)", "IQR", "ratio to ours", "BLEU", "lines = ours"],
        rows,
    )
    payload = {
        "description": "ONNX (onnxruntime float32/int8) vs our generate (and CTranslate2 for a Transformer): "
        "sentences/s with forced length, and BLEU",
        "run": str(run),
        "model_type": model_type,
        "test_set": {"src": args.src, "ref": args.ref, "sentences": len(sources)},
        "threads": args.threads,
        "rounds": args.rounds,
        "sentences": n_sentences,
        "batch_size": args.batch_size,
        "new_tokens_per_sentence": new_tokens,
        "workers": {name: w.info for name, w in workers.items()},
        "gap_ms": args.gap_ms,
        "results": results,
        "quality": quality_results,
    }
    shutil.rmtree(folder, ignore_errors=True)
    write_result(f"onnx_{model_type}", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
