"""Benchmark 2: the whole training pipeline for the same wall time on Multi30k.

Ours: `attention_seq2seq.training.train.train()` (Accelerate, token-budget batches of 4,096 padded
tokens from the data layer's `TokenBudgetBatchSampler`). Peer: `Seq2SeqTrainer` +
`DataCollatorForSeq2Seq` + `MarianMTModel`, with everything left at the defaults a user gets
(random sampling, fused AdamW, no length grouping), except the batch size: a fixed number of
sentences chosen so that a step holds on average as many non-padding target tokens as one of our
token-budget batches. A third side, `marian_grouped`, is the same peer with
`train_sampling_strategy="group_by_length"` (transformers' answer to padding), reported for
information; the goal is stated against the defaults. Same model dimensions, same tokenizer \
(the benchmark's Multi30k tokenizer,
handed to our trainer through `tokenizer_path`), same optimisation hyperparameters (AdamW lr 5e-4,
betas 0.9/0.98, inverse-sqrt schedule with 4,000 warm-up steps, label smoothing 0.1, gradient
clipping at 1.0). No validation or checkpoint inside the timed window on either side.

Instrumentation, the same on both sides: the non-padding target tokens of every optimizer update
are counted, and the clock runs from the start of the first update to the end of the last one, so
data loading and collation between updates are inside the window; model building, corpus loading
and tokenization before the loop are not. Each run is a fresh subprocess with fixed threads and
stops after `--seconds` of training; runs alternate ours, marian, marian_grouped, then the reverse.

    python benchmarks/bench_pipeline.py [--quick] [--seconds 50] [--runs 2] [--threads 2]
    python benchmarks/bench_pipeline.py --side ours|marian|marian_grouped --seconds 50 --out run.json   (one run)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.machine import base_argparser, log, set_threads
from harness.data import build_tokenizer, multi30k_dir
from harness.peers import TransformerDims, build_marian
from harness.timing import paired_ratio_summary, summarize
from harness.results import fmt, goal_entry, print_table, spread, write_result

GOAL_RATIO = 1.5
SIDES = [
    "ours",
    "marian",
    "marian_grouped",
]  # marian: the defaults; marian_grouped: train_sampling_strategy="group_by_length"
MAX_TOKENS = 4096
HYPER = {
    "learning_rate": 5e-4,
    "adam_beta1": 0.9,
    "adam_beta2": 0.98,
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "warmup_steps": 4000,
    "label_smoothing": 0.1,
    "max_grad_norm": 1.0,
    "seed": 1234,
}


def tokenizer_dir(dims: TransformerDims) -> Path:
    build_tokenizer(dims.vocab_size)  # trains and caches it once
    return Path(os.environ.get("BENCH_CACHE", "/tmp/attention_seq2seq_bench")) / f"tok{dims.vocab_size}"


def mean_tokens_per_budget_batch(tokenizer) -> dict:
    """Mean non-padding target tokens per batch of the data layer's sampler over one epoch, and
    the mean target length: together they give the peer's batch size."""
    import numpy as np
    from attention_seq2seq.data import TokenBudgetBatchSampler

    from harness.data import read_pairs, tokenize_pairs

    src, tgt = tokenize_pairs(tokenizer, read_pairs("train"))
    lengths = np.array([[len(s), len(t)] for s, t in zip(src, tgt)])
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=MAX_TOKENS, shuffle=True, seed=HYPER["seed"])
    batches = list(sampler)
    tgt_tokens = float(lengths[:, 1].sum())
    return {
        "batches_per_epoch": len(batches),
        "mean_target_tokens_per_batch": tgt_tokens / len(batches),
        "mean_target_length": tgt_tokens / len(lengths),
        "mean_sentences_per_batch": len(lengths) / len(batches),
    }


class Meter:
    """Counts target tokens per optimizer update and the time from the first update's start to
    the last update's end; `over()` says when `seconds` of training have passed."""

    def __init__(self, seconds: float):
        self.seconds, self.tokens, self.updates, self.padded = seconds, 0, 0, 0
        self.start = self.end = self.threads = None
        self.update_seconds = []

    def begin(self) -> None:
        import torch

        self.update_start = time.perf_counter()
        if self.start is None:
            self.start = self.update_start
            self.threads = torch.get_num_threads()

    def finish(self, tokens: int, padded_target_positions: int) -> None:
        self.end = time.perf_counter()
        self.update_seconds.append(self.end - self.update_start)
        self.tokens += tokens
        self.padded += padded_target_positions
        self.updates += 1

    def over(self) -> bool:
        return self.start is not None and time.perf_counter() - self.start >= self.seconds

    def result(self) -> dict:
        elapsed = (self.end - self.start) if self.start is not None and self.end is not None else float("nan")
        return {
            "target_tokens": self.tokens,
            "updates": self.updates,
            "seconds": elapsed,
            "target_tokens_per_s": self.tokens / elapsed,
            "tokens_per_update": self.tokens / max(1, self.updates),
            "target_padding_fraction": 1.0 - self.tokens / max(1, self.padded),
            "median_update_seconds": sorted(self.update_seconds)[len(self.update_seconds) // 2]
            if self.update_seconds
            else None,
            "torch_threads_in_loop": self.threads,
        }


def run_ours(seconds: float, dims: TransformerDims, workdir: Path) -> dict:
    import attention_seq2seq.training.train as trainer

    meter = Meter(seconds)
    original = trainer.optimizer_update

    def timed_update(accelerator, model, optimizer, scheduler, micro, *args, **kwargs):
        meter.begin()
        loss, num_tokens = original(accelerator, model, optimizer, scheduler, micro, *args, **kwargs)
        meter.finish(int(num_tokens), sum(mb["labels"].numel() for mb in micro))
        return loss, num_tokens

    trainer.optimizer_update = timed_update
    config = trainer.TrainConfig(
        model_family="transformer",
        model_config={
            "d_model": dims.d_model,
            "encoder_layers": dims.layers,
            "decoder_layers": dims.layers,
            "encoder_attention_heads": dims.heads,
            "decoder_attention_heads": dims.heads,
            "encoder_ffn_dim": dims.ffn,
            "decoder_ffn_dim": dims.ffn,
            "dropout": dims.dropout,
            "activation_function": "relu",
            "norm_order": "post",
            "scale_embedding": True,
            "max_position_embeddings": dims.max_positions,
            "share_encoder_decoder_embeddings": True,
            "tie_word_embeddings": True,
        },
        corpus=f"multi30k:{multi30k_dir()}:de-en",
        tokenizer_path=str(tokenizer_dir(dims)),
        vocab_size=dims.vocab_size,
        max_tokens=MAX_TOKENS,
        schedule="inverse_sqrt",
        max_time_minutes=seconds / 60.0,
        log_every=5,
        eval_every=10**9,
        save_every=10**9,
        max_eval_samples=8,
        eval_num_beams=1,
        max_test_samples=8,
        test_num_beams=1,
        num_plot_sentences=0,
        keep_best_k=1,
        log_with="none",
        output_dir=str(workdir / "ours"),
        **HYPER,
    )
    trainer.train(config)
    return meter.result()


def run_marian(seconds: float, dims: TransformerDims, workdir: Path, batch_size: int, sampling: str = "random") -> dict:
    import datasets
    from transformers import (
        DataCollatorForSeq2Seq,
        PreTrainedTokenizerFast,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        TrainerCallback,
    )

    from harness.data import read_pairs

    meter = Meter(seconds)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir(dims)))
    pairs = read_pairs("train")
    raw = datasets.Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})

    def preprocess(examples):
        return tokenizer(examples["source"], text_target=examples["target"], max_length=128, truncation=True)

    train_set = raw.map(preprocess, batched=True, remove_columns=["source", "target"])
    model = build_marian(dims, seed=HYPER["seed"])

    class Timed(Seq2SeqTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            meter.begin()
            self._bench_tokens = int((inputs["labels"] != -100).sum())
            self._bench_padded = inputs["labels"].numel()
            return super().training_step(model, inputs, num_items_in_batch)

    class StopAfter(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # after the optimizer step
            meter.finish(trainer_obj._bench_tokens, trainer_obj._bench_padded)
            if meter.over():
                control.should_training_stop = True

    args = Seq2SeqTrainingArguments(
        output_dir=str(workdir / "marian"),
        per_device_train_batch_size=batch_size,
        learning_rate=HYPER["learning_rate"],
        adam_beta1=HYPER["adam_beta1"],
        adam_beta2=HYPER["adam_beta2"],
        adam_epsilon=HYPER["adam_epsilon"],
        weight_decay=HYPER["weight_decay"],
        warmup_steps=HYPER["warmup_steps"],
        lr_scheduler_type="inverse_sqrt",
        label_smoothing_factor=HYPER["label_smoothing"],
        max_grad_norm=HYPER["max_grad_norm"],
        seed=HYPER["seed"],
        max_steps=10**7,
        logging_steps=50,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
        train_sampling_strategy=sampling,
    )
    trainer_obj = Timed(
        model=model,
        args=args,
        train_dataset=train_set,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        callbacks=[StopAfter()],
    )
    trainer_obj.train()
    return meter.result()


def one_run(side: str, seconds: float, out: Path, threads: int, batch_size: int) -> None:
    set_threads(threads)
    dims = TransformerDims()
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as tmp:
        if side == "ours":
            result = run_ours(seconds, dims, Path(tmp))
        else:
            sampling = "group_by_length" if side == "marian_grouped" else "random"
            result = run_marian(seconds, dims, Path(tmp), batch_size, sampling)
    out.write_text(json.dumps({"side": side, "threads": threads, **result}))


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--runs", type=int, default=None, help="runs per side")
    parser.add_argument("--side", choices=SIDES)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--batch-size", type=int, default=None, help="peer's sentences per step (default: matched)")
    args = parser.parse_args(argv)
    seconds = args.seconds or (20.0 if args.quick else 50.0)
    runs = args.runs or (1 if args.quick else 2)

    dims = TransformerDims()
    if args.side:
        one_run(args.side, seconds, args.out, args.threads, args.batch_size or 0)
        return {}

    set_threads(args.threads)
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir(dims)))
    budget = mean_tokens_per_budget_batch(tokenizer)
    batch_size = args.batch_size or max(1, round(budget["mean_target_tokens_per_batch"] / budget["mean_target_length"]))
    log(
        f"ours: {budget['mean_target_tokens_per_batch']:.0f} target tokens per batch on average "
        f"-> Marian batch size {batch_size}"
    )

    results = {side: [] for side in SIDES}
    order = []
    for r in range(runs):
        order += SIDES if r % 2 == 0 else SIDES[::-1]
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_runs_") as tmp:
        for i, side in enumerate(order):
            out = Path(tmp) / f"{i}_{side}.json"
            cmd = [
                sys.executable,
                __file__,
                "--side",
                side,
                "--seconds",
                str(seconds),
                "--out",
                str(out),
                "--threads",
                str(args.threads),
                "--batch-size",
                str(batch_size),
            ]
            started = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{side} run failed:\n{proc.stderr[-4000:]}")
            result = json.loads(out.read_text())
            result["process_seconds"] = time.perf_counter() - started
            results[side].append(result)
            log(
                f"run {i + 1}/{len(order)} {side}: {result['target_tokens_per_s']:.0f} tgt tok/s, "
                f"{result['updates']} updates, {result['tokens_per_update']:.0f} tok/update"
            )

    rates = {side: [r["target_tokens_per_s"] for r in results[side]] for side in results}
    summary = {side: summarize(rates[side]) for side in rates}
    ratio = paired_ratio_summary(rates["ours"], rates["marian"])
    ratio_grouped = paired_ratio_summary(rates["ours"], rates["marian_grouped"])
    labels = {
        "ours": "ours (Accelerate, token budget)",
        "marian": "Seq2SeqTrainer + Marian (defaults)",
        "marian_grouped": "Seq2SeqTrainer + Marian, group_by_length",
    }
    rows = [
        [
            labels[side],
            fmt(summary[side]["median"], 0),
            spread(summary[side], 0),
            f"{statistics_mean([r['tokens_per_update'] for r in results[side]]):.0f}",
            f"{100 * statistics_mean([r['target_padding_fraction'] for r in results[side]]):.0f}%",
            f"{statistics_mean([r['median_update_seconds'] for r in results[side]]):.2f}",
            f"{statistics_mean([r['updates'] for r in results[side]]):.0f}",
            "" if side == "ours" else f"{(ratio if side == 'marian' else ratio_grouped)['median']:.3f}x",
        ]
        for side in results
    ]
    print_table(
        f"Training pipeline, {seconds:.0f} s of training per run, {runs} runs per side, {args.threads} threads",
        ["pipeline", "tgt tok/s (median)", "IQR", "tgt tok/update", "tgt padding", "s/update", "updates", "ours/this"],
        rows,
    )
    payload = {
        "description": "whole training pipeline, same wall time: our Accelerate trainer vs "
        "Seq2SeqTrainer + DataCollatorForSeq2Seq + MarianMTModel",
        "dims": dims,
        "threads": args.threads,
        "seconds_per_run": seconds,
        "runs_per_side": runs,
        "ours_token_budget": MAX_TOKENS,
        "ours_budget_stats": budget,
        "marian_batch_size": batch_size,
        "hyperparameters": HYPER,
        "runs": results,
        "target_tokens_per_s": summary,
        "ratio_ours_over_marian": ratio,
        "ratio_ours_over_marian_grouped": ratio_grouped,
        "goals": [
            goal_entry(
                "pipeline_target_tokens_per_s_ratio",
                ratio["median"],
                GOAL_RATIO,
                note="peer with Trainer defaults (random sampling)",
            ),
            goal_entry(
                "pipeline_target_tokens_per_s_ratio_vs_group_by_length",
                ratio_grouped["median"],
                GOAL_RATIO,
                note="peer with train_sampling_strategy='group_by_length' (not asked by the issue)",
            ),
        ],
    }
    write_result("pipeline", payload, args.quick)
    return payload


def statistics_mean(values):
    return sum(values) / len(values)


if __name__ == "__main__":
    main()
