"""Benchmark 3: translation speed, ours vs MarianMTModel `generate`, greedy and beam 5.

Both models have the same dimensions (see `harness.peers.TransformerDims`) and are freshly initialised
(speed does not depend on the weights once the output length is fixed). Every sentence gets
exactly the same number of new tokens on both sides, N, the mean length (pieces + `</s>`) of the
Multi30k test2016 references, rounded up. Both sides receive one identical `GenerationConfig`.
Two ways to force the length (`--force-length`):

- `no-eos` (default): no end-of-sentence token (`eos_token_id=None` in both models' generation
  configs and in the one passed), so nothing stops before `max_new_tokens = N`; the decoding loop
  runs no logits processor, as in a real translation, where stopping at `</s>` costs one `isin`
  per step.
- `min-new-tokens` (the method of the first measurements): `min_new_tokens = max_new_tokens = N`
  keeps `</s>` suppressed until the N-th token. transformers implements this with two logits
  processors that each copy and mask the (batch, vocab_size) scores every step: 15% (ours) and
  12% (Marian) of greedy decoding time here, work a real translation does not do.

Sources are the Multi30k test2016 German sentences (all 1,000; `--sentences` takes fewer) in file
order, in batches of 64. Each round translates every batch on both sides back to back, the
order alternating from batch to batch; a round's time per side is the sum over its batches.
Reported: sentences/s, median and IQR over rounds, and the ratio ours/Marian paired per round.

`--device cuda` runs both sides on the GPU (each translation is timed up to a synchronisation);
`--mixed-precision bf16` decodes under bf16 autocast on both sides; `--result-name` names the JSON.

    python benchmarks/bench_generate.py [--quick] [--threads 2] [--rounds 5] [--sentences 1000]
                                        [--force-length no-eos|min-new-tokens] [--beams 1 5]
                                        [--device cpu|cuda|auto] [--mixed-precision no|bf16] [--result-name NAME]

A run with fewer rounds or sentences than the defaults writes results/generate*_custom.json, so
it never replaces the reference measurement.
"""

from __future__ import annotations

import time

from harness.machine import base_argparser, log, resolve_device, set_threads, sync
from harness.data import test2016_translation_setup
from harness.peers import TransformerDims, build_marian, build_ours
from harness.timing import paired_ratio_summary, summarize
from harness.results import fmt, goal_entry, print_table, spread, write_result

GOAL_RATIO = 1.2


FORCE_LENGTH = ("no-eos", "min-new-tokens")


def generation_config(num_beams: int, new_tokens: int, force_length: str = "no-eos"):
    """The one config both sides decode with: exactly `new_tokens` new tokens per sentence."""
    from transformers import GenerationConfig

    if force_length not in FORCE_LENGTH:
        raise ValueError(f"force_length must be one of {FORCE_LENGTH}, got {force_length!r}")
    no_eos = force_length == "no-eos"
    return GenerationConfig(
        num_beams=num_beams,
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=None if no_eos else new_tokens,
        length_penalty=1.0,
        early_stopping=False,
        decoder_start_token_id=1,
        bos_token_id=1,
        eos_token_id=None if no_eos else 2,
        pad_token_id=0,
        forced_eos_token_id=None,
        use_cache=True,
    )


def main(argv=None) -> dict:
    import torch

    parser = base_argparser(__doc__)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--sentences", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument(
        "--force-length",
        choices=FORCE_LENGTH,
        default="no-eos",
        help="how both sides are made to generate exactly N tokens (see the module docstring)",
    )
    parser.add_argument("--mixed-precision", choices=("no", "bf16"), default="no")
    parser.add_argument("--result-name", default=None, help="JSON file name under the results folder (without .json)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    n_sentences = args.sentences or (32 if args.quick else 1000)
    batch_size = min(args.batch_size, 16) if args.quick else args.batch_size
    threads = set_threads(args.threads)
    device = resolve_device(args.device)

    dims = TransformerDims()
    tokenizer, test_sources, new_tokens = test2016_translation_setup(dims)
    sources = test_sources[:n_sentences]
    batches = [
        tokenizer(sources[i : i + batch_size], padding=True, return_tensors="pt").to(device)
        for i in range(0, len(sources), batch_size)
    ]
    models = {"ours": build_ours(dims).to(device).eval(), "marian": build_marian(dims).to(device).eval()}
    if args.force_length == "no-eos":
        for model in models.values():  # generate() fills fields left None from the model's config
            model.generation_config.eos_token_id = None
    log(
        f"{len(sources)} sentences in batches of {batch_size}, {new_tokens} new tokens each "
        f"(length forced by {args.force_length}); {device}, threads={threads}"
    )
    import contextlib

    def autocast():
        if args.mixed_precision == "bf16":
            return torch.autocast(device.split(":")[0], dtype=torch.bfloat16)
        return contextlib.nullcontext()

    results, goals = {}, []
    for beams in args.beams:
        config = generation_config(beams, new_tokens, args.force_length)

        def translate(name: str, batch) -> torch.Tensor:
            with torch.inference_mode(), autocast():
                out = models[name].generate(
                    input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], generation_config=config
                )
            sync(device)
            # decoder start + exactly N new tokens, on both sides
            assert out.shape[1] == new_tokens + 1, (name, tuple(out.shape))
            return out

        for name in models:  # warm-up
            translate(name, batches[0])
        seconds = {name: [] for name in models}
        for r in range(rounds):
            spent = {name: 0.0 for name in models}
            for i, batch in enumerate(batches):  # both sides back to back on every batch
                for name in list(models) if (r + i) % 2 == 0 else list(models)[::-1]:
                    start = time.perf_counter()
                    translate(name, batch)
                    spent[name] += time.perf_counter() - start
            for name in models:
                seconds[name].append(spent[name])
            log(
                f"beam {beams} round {r + 1}/{rounds}: "
                + ", ".join(f"{n} {len(sources) / seconds[n][-1]:.1f} sent/s" for n in models)
            )
        rates = {name: [len(sources) / s for s in seconds[name]] for name in models}
        ratio = paired_ratio_summary(rates["ours"], rates["marian"])
        mode = "greedy" if beams == 1 else f"beam{beams}"
        results[mode] = {
            "num_beams": beams,
            "seconds_per_round": seconds,
            "sentences_per_s": {name: summarize(rates[name]) for name in models},
            "ratio_ours_over_marian": ratio,
        }
        suffix = "" if device == "cpu" else f"_{device}"
        goals.append(goal_entry(f"generate_{mode}_sentences_per_s_ratio{suffix}", ratio["median"], GOAL_RATIO))

    rows = []
    for mode, res in results.items():
        for name in models:
            s = res["sentences_per_s"][name]
            rows.append(
                [
                    mode,
                    name,
                    fmt(s["median"], 1),
                    spread(s, 1),
                    f"{res['ratio_ours_over_marian']['median']:.3f}x" if name == "ours" else "",
                ]
            )
    print_table(
        f"Translation on {device}, {len(sources)} Multi30k test2016 sources, {new_tokens} tokens each, "
        f"batch {batch_size}, {threads} threads",
        ["mode", "model", "sent/s (median)", "IQR", "ratio ours/marian"],
        rows,
    )
    payload = {
        "description": "generate() sentences/s with forced output length, ours vs MarianMTModel",
        "dims": dims,
        "device": device,
        "mixed_precision": args.mixed_precision,
        "threads": threads,
        "rounds": rounds,
        "sentences": len(sources),
        "batch_size": batch_size,
        "new_tokens_per_sentence": new_tokens,
        "force_length": args.force_length,
        "results": results,
        "goals": goals,
    }
    if args.force_length != "no-eos":  # the earlier method: reported for information next to the goal
        payload["goals"] = [
            dict(
                g, metric=g["metric"] + "_min_new_tokens", note="(min_new_tokens processors on both sides, information)"
            )
            for g in goals
        ]
    name = "generate" if args.force_length == "no-eos" else "generate_min_new_tokens"
    custom = not args.quick and (rounds != 5 or len(sources) != len(test_sources))
    write_result(args.result_name or (name + ("_custom" if custom else "")), payload, args.quick)
    return payload


if __name__ == "__main__":
    main()
