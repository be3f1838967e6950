"""Probe (for information, not in run_all): what the label-smoothed cross-entropy costs inside the
bf16 CPU training step, computed in cache-sized blocks of rows (the model's default on a CPU,
`_loss_block_rows` in modeling/cpu_fast_paths.py), in one block over all rows (the
same function before 2026-12-01), and by the peer `F.cross_entropy(..., label_smoothing=0.1)`.

The step is the trainer's: logits from the model, the summed loss of the side (`token_loss_sum`,
ε = 0.1), backward, fused AdamW, under bf16 CPU autocast (`mixed_precision: bf16`). The model is
the Multi30k Transformer-small candidate shape (3 + 3 layers, d_model 256, 8 heads, FFN 1,024,
pre-norm, dropout 0.3, 8,000-piece vocabulary). Batches: Multi30k train token-budget batches of at
most 1,024 padded tokens, the fullest three quarters (`harness.data.load_batches`).

All sides train one and the same model (learning rate 1e-4), so they differ only in the loss;
a fourth side, `no_loss`, replaces the loss by the sum of one logit column, so side − no_loss is
what the loss itself costs per step. Each round runs every batch once per side, the side order
reversed every other round. Reported: ms per step (median over rounds), each side's loss cost,
and the paired per-round ratios of step time. A second table times the loss alone (forward +
backward) on one real batch's bf16 logits.

Result on the project's 2-core AMD EPYC (2026-12-01): see benchmarks/README.md ("fourth pass").

    python benchmarks/probes/probe_loss_blocks.py [--quick] [--threads 2] [--batches 40] [--rounds 8]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness, the benchmarks

from harness.machine import base_argparser, log, set_threads
from harness.data import load_batches
from harness.peers import TransformerDims
from harness.results import write_result

SIDES = ("blocks", "one_block", "torch_ce", "no_loss")


def loss_fn(side: str):
    """(logits (batch, tgt_len, vocab_size), labels (batch, tgt_len)) → summed loss for a side."""
    import torch.nn.functional as F

    from attention_seq2seq.modeling import cpu_fast_paths as modeling
    from attention_seq2seq.training.train import token_loss_sum

    if side in ("blocks", "one_block"):
        block_bytes = modeling._LOSS_BLOCK_BYTES if side == "blocks" else 1 << 62

        def run(logits, labels):
            saved, modeling._LOSS_BLOCK_BYTES = modeling._LOSS_BLOCK_BYTES, block_bytes  # read in forward only
            try:
                return token_loss_sum(logits, labels, 0.1)
            finally:
                modeling._LOSS_BLOCK_BYTES = saved

        return run
    if side == "torch_ce":
        return lambda logits, labels: F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), label_smoothing=0.1, reduction="sum"
        )
    if side == "no_loss":
        return lambda logits, labels: logits[..., 0].float().sum()
    raise ValueError(f"side must be one of {SIDES}; got {side!r}")


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    num_batches = args.batches or (6 if args.quick else 40)
    rounds = args.rounds or (2 if args.quick else 8)

    import torch

    from attention_seq2seq.configuration.configuration_transformer_seq2seq import TransformerSeq2SeqConfig
    from attention_seq2seq.modeling.modeling_transformer_seq2seq import TransformerSeq2SeqForConditionalGeneration
    from harness.peers import shared_config_kwargs

    _, batches = load_batches(1024, num_batches)
    dims = TransformerDims(ffn=1024, dropout=0.3)
    torch.manual_seed(0)
    config = TransformerSeq2SeqConfig(
        **shared_config_kwargs(dims), position_embedding_type="sinusoidal", norm_order="pre"
    )
    model = TransformerSeq2SeqForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=True)
    losses = {side: loss_fn(side) for side in SIDES}

    def step(side: str, batch: dict) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                decoder_input_ids=batch["decoder_input_ids"],
                use_cache=False,
            ).logits
        (losses[side](logits, batch["labels"]) / (batch["labels"] != -100).sum()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for side in SIDES:  # warm-up
        for batch in batches[:3]:
            step(side, batch)
    seconds = {side: [] for side in SIDES}
    for r in range(rounds):
        order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            start = time.perf_counter()
            for batch in batches:
                step(side, batch)
            seconds[side].append(time.perf_counter() - start)
        log(f"round {r}: " + ", ".join(f"{s} {seconds[s][-1]:.2f} s" for s in SIDES))

    ms = {side: 1000 * statistics.median(v) / len(batches) for side, v in seconds.items()}
    ratios = {side: statistics.median(a / b for a, b in zip(seconds[side], seconds["blocks"])) for side in SIDES}
    print(f"\nTraining step, {len(batches)} batches x {rounds} rounds, {threads} threads, bf16 autocast")
    print(f"{'side':<10} {'ms/step':>8} {'loss ms/step':>13} {'step time / blocks':>19}")
    for side in SIDES:
        print(f"{side:<10} {ms[side]:8.1f} {ms[side] - ms['no_loss']:13.1f} {ratios[side]:19.3f}")

    # The loss alone, on one real batch's bf16 logits.
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        batch = max(batches, key=lambda b: b["labels"].numel())
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=batch["decoder_input_ids"],
            use_cache=False,
        ).logits
    alone = {}
    for side in SIDES[:3]:
        times = []
        for _ in range(5 + (10 if args.quick else 40)):
            leaf = logits.detach().requires_grad_()
            start = time.perf_counter()
            losses[side](leaf, batch["labels"]).backward()
            times.append(time.perf_counter() - start)
        alone[side] = 1000 * statistics.median(times[5:])
    print(
        f"\nLoss alone, forward + backward, bf16 logits {tuple(logits.shape)}: "
        + ", ".join(f"{s} {alone[s]:.1f} ms" for s in alone)
    )
    payload = {
        "threads": threads,
        "batches": len(batches),
        "rounds": rounds,
        "ms_per_step": ms,
        "step_time_over_blocks": ratios,
        "loss_alone_ms": alone,
        "logits_shape": list(logits.shape),
    }
    write_result("loss_blocks_bf16", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
