"""bf16 autocast against float32 for the model's own training step on this CPU: the measurement
behind each row of `mixed_precision: auto`'s table (training/precision.py, docs/training.md).

The package decides `auto` from the CPU's declared features and never times anything; this
script is how a row is checked on a new host. For each main-job recipe (the Luong LSTM and the
Transformer-small of the Bible job) it builds the model, runs untimed warm-up steps, then times
one training step (forward, the trainer's summed token loss, backward, AdamW) on padded
synthetic token-budget batches of 16, 32 and 64 tokens, float32 and bf16 autocast interleaved
(f, b, b, f, ...) so that other load slows both alike. It prints the float32 / bf16 ratio per
model (above 1: bf16 is faster; on a CPU without bf16 units oneDNN's LSTM may refuse bf16
outright, which it reports) with the CPU's vendor and bf16 flags, and writes
results/precision.json.

    python benchmarks/bench_precision.py [--quick] [--threads 2] [--rounds 7]
"""

from __future__ import annotations

import contextlib
import statistics
import time

import yaml

from harness.machine import REPO_ROOT, base_argparser, set_threads
from harness.results import write_result
from harness.timing import summarize

RECIPES = ("main-job-bible-rnn-luong", "main-job-bible-transformer-small")
LENGTHS = (16, 32, 64)


def synthetic_batch(vocab_size: int, max_tokens: int, length: int) -> dict:
    """``max_tokens // length`` pairs padded to ``length`` tokens, each side between half that and
    all of it, as the token-budget sampler makes them (ids from a private generator)."""
    import torch

    generator = torch.Generator().manual_seed(length)
    batch = max(1, max_tokens // length)
    ids = torch.randint(4, vocab_size, (batch, length), generator=generator)
    labels = torch.randint(4, vocab_size, (batch, length), generator=generator)
    positions = torch.arange(length)
    lengths = torch.randint((length + 1) // 2, length + 1, (2, batch), generator=generator)
    lengths[:, 0] = length
    mask = (positions < lengths[0, :, None]).long()
    labels = labels.masked_fill(positions >= lengths[1, :, None], -100)
    decoder_input_ids = torch.cat([labels.new_ones(batch, 1), labels[:, :-1].clamp(min=0)], dim=1)
    return {"input_ids": ids * mask, "attention_mask": mask, "decoder_input_ids": decoder_input_ids, "labels": labels}


def time_model(recipe: dict, rounds: int, lengths: tuple[int, ...] = LENGTHS) -> dict:
    import torch

    from attention_seq2seq.modeling.registry import BY_NAME
    from attention_seq2seq.training.objectives import token_loss_sum

    family = BY_NAME[recipe["model_family"]]
    model = family.lm_cls()(family.config_cls()(vocab_size=recipe["vocab_size"], **recipe["model_config"]))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = [synthetic_batch(recipe["vocab_size"], recipe["max_tokens"], n) for n in lengths]

    def step(batch: dict, bf16: bool) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
        token_loss_sum(logits, batch["labels"], 0.1, model.config).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    try:
        for batch in batches:  # warm-up: first calls pay for allocation and kernel selection
            for bf16 in (False, True):
                step(batch, bf16)
    except RuntimeError as error:  # e.g. oneDNN's LSTM under bf16 on a CPU without bf16 units
        return {"bf16_fails": str(error).splitlines()[0]}
    ratios, seconds = [], {"float32": [], "bf16": []}
    for r in range(rounds):
        spent = {"float32": 0.0, "bf16": 0.0}
        for mode in ("float32", "bf16") if r % 2 == 0 else ("bf16", "float32"):
            spent[mode] = sum(step(batch, mode == "bf16") for batch in batches) / len(batches)
            seconds[mode].append(spent[mode])
        ratios.append(spent["float32"] / spent["bf16"])
    return {
        "float32_step_s": statistics.median(seconds["float32"]),
        "bf16_step_s": statistics.median(seconds["bf16"]),
        "ratio": summarize(ratios),
    }


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    rounds = 2 if args.quick else args.rounds
    from attention_seq2seq.training.precision import read_cpuinfo, resolve_mixed_precision

    cpuinfo = read_cpuinfo()
    flags = sorted({"avx512_bf16", "amx_bf16"} & set(cpuinfo.get("flags", "").split()))
    results = {}
    for name in RECIPES:
        recipe = yaml.safe_load((REPO_ROOT / "training" / "recipes" / f"{name}.yaml").read_text(encoding="utf-8"))
        if args.quick:  # a smoke test of the script: one small batch shape
            recipe["max_tokens"] = 256
        results[name] = time_model(recipe, rounds, LENGTHS[:1] if args.quick else LENGTHS)
    choice = resolve_mixed_precision(cpuinfo)
    print(f"{cpuinfo.get('vendor_id')} {cpuinfo.get('model name')}, bf16 flags {flags or 'none'}")
    for name, result in results.items():
        if "bf16_fails" in result:
            print(f"  {name}: bf16 autocast fails here: {result['bf16_fails']}")
        else:
            ratio = result["ratio"]
            print(f"  {name}: bf16 autocast {ratio['median']:.2f}x float32 (IQR {ratio['q1']:.2f}-{ratio['q3']:.2f})")
    print(f"  mixed_precision auto picks: {choice.reason}")
    payload = {"threads": threads, "rounds": rounds, "vendor": cpuinfo.get("vendor_id"), "bf16_flags": flags,
               "auto": choice.to_dict(), "models": results}  # fmt: skip
    write_result("precision", payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
