"""Benchmark 4: RNN training step, our Luong (general score, input feeding) and Bahdanau models vs
JoeyNMT 2.3's recurrent encoder-decoder with the same sizes.

Sizes, both sides: one joint 8,000-piece vocabulary with source and target sharing one embedding
matrix, embeddings 256, a one-layer bidirectional LSTM encoder of 256 units per direction (512
together), a one-layer LSTM decoder of 512 units initialised through a tanh projection ("bridge")
of the encoder's final state, dropout 0.1, an untied 512 -> 8,000 output layer for Luong.

Peers: JoeyNMT's `RecurrentDecoder` always computes Luong's attentional vector
h̃_t = tanh(W_c [h_t; c_t]) with input feeding; `attention: luong` is the bilinear ("general")
score, `attention: bahdanau` the additive score (both computed from the new decoder state h_t).
So the Luong pair is like for like; our Bahdanau model follows the paper instead (the score from
s_{i-1}, the context in the RNN input, a maxout deep output of width 256) and is compared with
JoeyNMT's `bahdanau` decoder, the closest thing a JoeyNMT user would pick.

JoeyNMT runs in its own virtual environment (`benchmarks/joeynmt_env.sh`) in a long-lived
subprocess (`joeynmt_worker.py`) that receives the very same batches (saved with torch.save,
sorted longest source first as JoeyNMT's packed encoder requires) and answers one JSON line per
step. Every batch runs on both sides back to back (order alternating from batch to batch; the
JoeyNMT step is timed inside the worker), so the two never run at the same time and load changes
hit both alike.
One step on both sides: forward, the mean cross-entropy over target tokens, backward, AdamW, zero_grad.

`--mixed-precision bf16` (information; the goal is stated for float32) runs our step under CPU
bf16 autocast, as our trainer's `mixed_precision: bf16` does, against two JoeyNMT sides: float32
(`joeynmt`, all a JoeyNMT 2.3 user gets on a CPU: it turns its `fp16` switch off there)
and its model under the same bf16 autocast (`joeynmt_bf16`, like for like, a setting JoeyNMT
itself does not offer). It writes results/rnn_bf16.json.

`--device cuda` runs both sides on the GPU (cuDNN's LSTM on both: JoeyNMT's encoder and decoder
RNNs and ours are torch.nn.LSTM); each step's time ends with a synchronisation. `--joeynmt-python`
(or JOEYNMT_PYTHON) names the interpreter that can import joeynmt (default .venv-joeynmt/bin/python);
scripts/gpu_check.sh passes its own python with JoeyNMT installed from a carried wheel.

    python benchmarks/bench_rnn.py [--quick] [--threads 2] [--rounds 4] [--batches 3] [--mixed-precision bf16]
                                   [--device cpu|cuda|auto] [--joeynmt-python PATH] [--result-name NAME]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from harness.machine import base_argparser, log, resolve_device, set_threads, to_device
from harness.data import batch_stats, load_batches
from harness.peers import JOEYNMT_PYTHON, JoeyWorker, count_params, make_train_step, sort_by_source_length
from harness.timing import paired_ratio_summary, summarize
from harness.results import fmt, goal_entry, print_table, spread, write_result

GOAL_RATIO = 1.5
SIZES = {
    "vocab_size": 8000,
    "embedding_size": 256,
    "encoder_hidden_size": 256,
    "hidden_size": 512,
    "layers": 1,
    "dropout": 0.1,
    "rnn_type": "lstm",
}


def build_ours_rnn(attention: str, seed: int = 0):
    import torch
    from attention_seq2seq.configuration.configuration_rnn_seq2seq import RNNSeq2SeqConfig
    from attention_seq2seq.modeling.modeling_rnn_seq2seq import RNNSeq2SeqForConditionalGeneration

    kwargs = {"score": "general", "input_feeding": True} if attention == "luong" else {}
    config = RNNSeq2SeqConfig(
        vocab_size=SIZES["vocab_size"],
        embedding_size=SIZES["embedding_size"],
        hidden_size=SIZES["hidden_size"],
        encoder_hidden_size=SIZES["encoder_hidden_size"],
        cell_type=SIZES["rnn_type"],
        encoder_layers=SIZES["layers"],
        decoder_layers=SIZES["layers"],
        bidirectional=True,
        dropout=SIZES["dropout"],
        bridge="projection",
        attention=attention,
        share_embeddings=True,
        tie_word_embeddings=False,
        **kwargs,
    )
    torch.manual_seed(seed)
    return RNNSeq2SeqForConditionalGeneration(config)


def main(argv=None) -> dict:
    import torch

    parser = base_argparser(__doc__)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--attentions", nargs="+", default=["luong", "bahdanau"])
    parser.add_argument("--mixed-precision", choices=("no", "bf16"), default="no")
    parser.add_argument(
        "--joeynmt-python",
        type=Path,
        default=JOEYNMT_PYTHON,
        help="a python that imports joeynmt 2.3 (default: $JOEYNMT_PYTHON or .venv-joeynmt/bin/python); "
        "'none': our side alone, no ratio (a rehearsal where JoeyNMT is not installed)",
    )
    parser.add_argument("--result-name", default=None, help="JSON file name under the results folder (without .json)")
    args = parser.parse_args(argv)
    bf16 = args.mixed_precision == "bf16"
    rounds = args.rounds or (2 if args.quick else 4)
    n_batches = args.batches or (2 if args.quick else 3)
    threads = set_threads(args.threads)
    device = resolve_device(args.device)
    python = None if str(args.joeynmt_python) == "none" else args.joeynmt_python
    if python is not None and os.sep in str(python) and not python.exists():
        raise SystemExit(f"{python} not found: run `bash benchmarks/joeynmt_env.sh` first (or give --joeynmt-python)")

    _, batches = load_batches(args.max_tokens, n_batches)
    batches = [sort_by_source_length(b) for b in batches]
    stats = [batch_stats(b) for b in batches]
    tgt_tokens = sum(s["tgt_tokens"] for s in stats)
    workdir = Path(tempfile.mkdtemp(prefix="bench_rnn_"))
    batches_path = workdir / "batches.pt"
    torch.save([{k: b[k] for k in ("input_ids", "labels", "decoder_input_ids")} for b in batches], batches_path)
    batches = [to_device(b, device) for b in batches]

    results, goals = {}, []
    peers = {"joeynmt": None, "joeynmt_bf16": "bf16"} if bf16 else {"joeynmt": None}
    if python is None:
        peers = {}
        log("--joeynmt-python none: our side alone, no JoeyNMT ratio")
    joey_info = {"skipped": "--joeynmt-python none"}
    for attention in args.attentions:
        model = build_ours_rnn(attention)
        step, _ = make_train_step(model, mixed_precision=args.mixed_precision, device=device)
        workers = {}
        try:
            for name, cast in peers.items():
                spec = {**SIZES, "attention": attention, "threads": threads, "autocast": cast, "device": device}
                workers[name] = JoeyWorker(spec, batches_path, workdir, name, python=python)
        except BaseException:
            for w in workers.values():
                w.close()
            raise
        joey_info = next(iter(workers.values())).info if workers else joey_info
        params = {"ours": count_params(model), **{name: w.info["params"] for name, w in workers.items()}}
        log(f"{attention}: params {params}; {len(batches)} batches, {tgt_tokens} target tokens per round")
        for batch in batches[:2]:  # warm-up
            step(batch)
        for w in workers.values():
            w.ask("warmup 2")

        sides = ["ours", *workers]
        seconds = {side: [] for side in sides}
        for r in range(rounds):
            spent = dict.fromkeys(sides, 0.0)
            for i, batch in enumerate(batches):  # every side back to back on every batch, order rotating
                k = (r + i) % len(sides)
                for side in sides[k:] + sides[:k]:
                    if side == "ours":
                        start = time.perf_counter()
                        step(batch)
                        spent[side] += time.perf_counter() - start
                    else:
                        spent[side] += workers[side].ask(f"step {i}")["seconds"]
            for side in spent:
                seconds[side].append(spent[side])
            log(
                f"{attention} round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {tgt_tokens / seconds[n][-1]:.0f} tok/s" for n in seconds)
            )
        for w in workers.values():
            w.close()
        rates = {side: [tgt_tokens / s for s in seconds[side]] for side in seconds}
        ratios = {peer: paired_ratio_summary(rates["ours"], rates[peer]) for peer in workers}
        results[attention] = {
            "params": params,
            "seconds_per_round": seconds,
            "tokens_per_s": {side: summarize(rates[side]) for side in rates},
            **{f"ratio_ours_over_{peer}": ratio for peer, ratio in ratios.items()},
        }
        suffix = "_bf16" if bf16 else ""
        note = "(ours bf16 vs JoeyNMT float32, information)" if bf16 else ""
        suffix += "" if device == "cpu" else f"_{device}"
        if "joeynmt" in ratios:
            goals.append(
                goal_entry(
                    f"rnn_{attention}_train_step_tokens_per_s_ratio{suffix}",
                    ratios["joeynmt"]["median"],
                    GOAL_RATIO,
                    note=note,
                )
            )
        if bf16 and "joeynmt_bf16" in ratios:
            goals.append(
                goal_entry(
                    f"rnn_{attention}_train_step_tokens_per_s_ratio_bf16_both",
                    ratios["joeynmt_bf16"]["median"],
                    GOAL_RATIO,
                    note="(both bf16, information)",
                )
            )
        del model, step

    rows = []
    for attention, res in results.items():
        for side in res["tokens_per_s"]:
            s = res["tokens_per_s"][side]
            ratio = res.get(f"ratio_ours_over_{side}")
            rows.append(
                [
                    attention,
                    side,
                    f"{res['params'][side] / 1e6:.2f}M",
                    fmt(s["median"], 0),
                    spread(s, 0),
                    f"{ratio['median']:.3f}x" if ratio else "",
                ]
            )
    print_table(
        f"RNN training step (forward+backward+AdamW) on {device}{', ours bf16 autocast' if bf16 else ''}, "
        "LSTM 256/512, "
        f"{threads} threads, {rounds} rounds x {len(batches)} batches",
        ["attention", "model", "params", "tgt tok/s (median)", "IQR", "ratio ours/this row"],
        rows,
    )
    payload = {
        "description": "RNN training step tokens/s, ours (Luong general + input feeding, Bahdanau) "
        "vs JoeyNMT 2.3 RecurrentDecoder"
        + (" (ours under bf16 autocast; JoeyNMT float32 and under bf16 autocast)" if bf16 else ""),
        "mixed_precision": args.mixed_precision,
        "device": device,
        "sizes": SIZES,
        "threads": threads,
        "rounds": rounds,
        "batches": stats,
        "target_tokens_per_round": tgt_tokens,
        "joeynmt": {k: v for k, v in joey_info.items() if k != "ready"},
        "results": results,
        "goals": goals,
    }
    write_result(args.result_name or ("rnn_bf16" if bf16 else "rnn"), payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
