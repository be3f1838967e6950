"""Probe (for information, not in run_all): does `torch.compile` speed up our Transformer-small
training step on a CPU?

The step is the trainer's (`training/train.py`): logits from the model, the summed label-smoothed
loss (`token_loss_sum`, ε = 0.1) divided by the batch's target tokens, backward, gradient
clipping at 1.0, fused AdamW, under bf16 CPU autocast (the Multi30k recipe's `mixed_precision:
bf16`), dropout 0.2, 6,000-piece vocabulary. Batches: Multi30k train token-budget batches of at
most 1,024 padded tokens (the recipe's `max_tokens`), the fullest three quarters of them
(`harness.data.load_batches`).
Sides, each on its own copy of the same initial weights:

* `eager`: the model as the trainer runs it;
* `compile_model`: `torch.compile(model, dynamic=True)` (inductor), the loss eager;
* `compile_all`: the forward pass and the loss compiled together as one function.

Every side first runs each batch once (the compiling happens there; its time is printed), then
`--rounds` rounds over all batches, the side order reversed every other round. Reported: target
tokens/s per side (median over rounds) and the ratio to `eager`. Result on the project's
2-core AMD EPYC (2026-12-01, results/torch_compile_bf16.json): compiling took up to 2 minutes
per side and made the step slower, 0.63x (`compile_model`) and 0.67x (`compile_all`), so the
trainer does not offer it.

    python benchmarks/probes/probe_torch_compile.py [--quick] [--threads 2] [--batches 24] [--rounds 3] \
[--modes eager,compile_model,compile_all]
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness, the benchmarks

from harness.machine import base_argparser, log, set_threads
from harness.data import load_batches
from harness.peers import TransformerDims, build_ours
from harness.results import write_result

MODES = ("eager", "compile_model", "compile_all")


def make_step(model, mode: str):
    """One trainer-like update on a batch under bf16 autocast; returns the summed loss."""
    import torch

    from attention_seq2seq.training.train import token_loss_sum

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=True)

    def forward_loss(m, batch):
        logits = m(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
            use_cache=False,
        ).logits
        return token_loss_sum(logits, batch["labels"], 0.1)

    if mode == "eager":
        run = lambda batch: forward_loss(model, batch)  # noqa: E731
    elif mode == "compile_model":
        compiled = torch.compile(model, dynamic=True)
        run = lambda batch: forward_loss(compiled, batch)  # noqa: E731
    elif mode == "compile_all":
        compiled_fn = torch.compile(forward_loss, dynamic=True)
        run = lambda batch: compiled_fn(model, batch)  # noqa: E731
    else:
        raise ValueError(f"mode must be one of {MODES}; got {mode!r}")

    def step(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = run(batch)
        (loss / (batch["labels"] != -100).sum()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated, from {MODES}; the first is the reference"
    )
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {MODES}")
    batches_n, rounds = (4, 1) if args.quick else (args.batches, args.rounds)
    threads = set_threads(args.threads)

    _, batches = load_batches(1024, batches_n, vocab_size=6000)
    tokens = sum(int((b["labels"] != -100).sum()) for b in batches)
    log(
        f"{len(batches)} batches, {tokens} target tokens, "
        f"source lengths {sorted(b['input_ids'].shape[1] for b in batches)}"
    )
    base = build_ours(TransformerDims(vocab_size=6000, dropout=0.2))

    steps, warmup_s = {}, {}
    for mode in modes:
        steps[mode] = make_step(copy.deepcopy(base), mode)
        start = time.perf_counter()
        for batch in batches:  # every shape once: compiling happens here
            steps[mode](batch)
        warmup_s[mode] = time.perf_counter() - start
        log(f"{mode}: first pass (compiling included) {warmup_s[mode]:.1f} s")

    rates = {m: [] for m in modes}
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else modes[::-1]:
            start = time.perf_counter()
            for batch in batches:
                steps[mode](batch)
            rates[mode].append(tokens / (time.perf_counter() - start))

    reference = statistics.median(rates[modes[0]])
    rows = {}
    for mode in modes:
        median = statistics.median(rates[mode])
        rows[mode] = {
            "target_tokens_per_s": median,
            "rounds": rates[mode],
            "ratio_to_" + modes[0]: median / reference,
            "first_pass_s": warmup_s[mode],
        }
        print(
            f"{mode:>14}: {median:7.0f} target tok/s   x{median / reference:.3f} of {modes[0]}   "
            f"first pass {warmup_s[mode]:.0f} s",
            flush=True,
        )
    result = {"threads": threads, "batches": len(batches), "rounds": rounds, "sides": rows}
    write_result("torch_compile_bf16", result, args.quick)
    return result


if __name__ == "__main__":
    main()
