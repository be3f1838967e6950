"""Probe (not in run_all.py): what the CPU fast paths and the modeling redesign cost or give, paired.

Three sides in one process, with the same weights, interleaved batch by batch (the order rotating):

- `after`: today's Transformer, `use_cpu_fast_paths=True` (the default);
- `reference`: today's Transformer, `use_cpu_fast_paths=False` (the reference code only);
- `before`: the code of main 796bb1c, before the redesign, imported from the legacy export's
  flattened files (tests/fixtures/legacy_exports/transformer_seq2seq).

Measured: the training step of benchmark 1 (forward with `labels=`, backward, AdamW, zero_grad; Multi30k
token-budget batches, benchmark dimensions) and greedy / beam `generate` on Multi30k test2016
sources with a fixed number of new tokens (no `</s>`). Reported per round: each side's time, and
the paired ratios after/before and after/reference (time ratios > 1: `after` is slower).

    python benchmarks/probes/probe_fast_paths.py [--threads 2] [--rounds 5] [--batches 3] [--sentences 64]
                                          [--parts train generate]
"""

from __future__ import annotations

import importlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the harness, the benchmarks

from harness.machine import REPO_ROOT, base_argparser, log, set_threads
from harness.data import load_batches
from harness.peers import TransformerDims, build_ours, make_train_step

LEGACY = REPO_ROOT / "tests" / "fixtures" / "legacy_exports" / "transformer_seq2seq"


def legacy_model_class():
    """`TransformerSeq2SeqForConditionalGeneration` as main 796bb1c wrote it (its flattened export code)."""
    folder = Path(tempfile.mkdtemp()) / "legacy_796bb1c"
    folder.mkdir()
    for file in LEGACY.glob("*.py"):
        shutil.copy(file, folder / file.name)
    (folder / "__init__.py").write_text("")
    sys.path.insert(0, str(folder.parent))
    module = importlib.import_module("legacy_796bb1c.modeling_transformer_seq2seq")
    return module.TransformerSeq2SeqForConditionalGeneration, module.TransformerSeq2SeqConfig


def paired(times: dict[str, list[float]], a: str, b: str) -> str:
    ratios = [x / y for x, y in zip(times[a], times[b])]
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return f"{a}/{b} time ratio median {statistics.median(ratios):.3f} (IQR {q[0]:.3f}-{q[2]:.3f})"


def main(argv=None) -> dict:
    parser = base_argparser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--parts", nargs="+", choices=("train", "generate"), default=["train", "generate"])
    args = parser.parse_args(argv)
    threads = set_threads(args.threads)
    import torch

    dims = TransformerDims()
    _, batches = load_batches(args.max_tokens, args.batches)
    after = build_ours(dims)
    legacy_cls, legacy_config_cls = legacy_model_class()
    settings = {k: v for k, v in after.config.to_diff_dict().items() if k != "use_cpu_fast_paths"}
    before = legacy_cls(legacy_config_cls(**settings))
    initial = {k: v.clone() for k, v in after.state_dict().items()}
    before.load_state_dict(initial)
    reference = build_ours(dims)
    reference.load_state_dict(initial)
    reference.config.use_cpu_fast_paths = False
    models = {"after": after, "reference": reference, "before": before}
    log(f"threads={threads}; sides {list(models)}; {args.batches} batches, {args.rounds} rounds")

    # Training step
    steps = {name: make_train_step(model)[0] for name, model in models.items()}
    names = list(models)
    train = {name: [] for name in names}
    for r in range(args.rounds if "train" in args.parts else 0):
        spent = dict.fromkeys(names, 0.0)
        for i, batch in enumerate(batches):
            order = names[(r + i) % 3 :] + names[: (r + i) % 3]
            for name in order:
                start = time.perf_counter()
                steps[name](batch)
                spent[name] += time.perf_counter() - start
        for name in names:
            train[name].append(spent[name])
        log(f"train round {r}: " + ", ".join(f"{n} {spent[n]:.3f}s" for n in names))

    # Generation
    sources = batches[0]["input_ids"][: args.sentences]
    mask = batches[0]["attention_mask"][: args.sentences]
    results = {}
    for beams in (1, 5) if "generate" in args.parts else ():
        gen = {name: [] for name in names}
        for model in models.values():  # the same weights again (the training steps moved them apart)
            model.load_state_dict(initial)
            model.eval()
            model.generation_config.eos_token_id = None
        kwargs = dict(
            attention_mask=mask,
            num_beams=beams,
            max_new_tokens=args.new_tokens,
            min_new_tokens=None,
            eos_token_id=None,
            do_sample=False,
        )
        outputs = {}
        for r in range(args.rounds):
            order = names[r % 3 :] + names[: r % 3]
            for name in order:
                start = time.perf_counter()
                with torch.no_grad():
                    outputs[name] = models[name].generate(sources, **kwargs)
                gen[name].append(time.perf_counter() - start)
            log(f"beam {beams} round {r}: " + ", ".join(f"{n} {gen[n][-1]:.3f}s" for n in names))
        same = all(torch.equal(outputs["after"], outputs[n]) for n in names)
        results[f"generate_beam{beams}"] = gen
        log(f"beam {beams}: identical output on all sides: {same}")
    if "train" in args.parts:
        results["train_step"] = train

    for key, times in results.items():
        print(f"{key}: " + "; ".join([paired(times, "after", "before"), paired(times, "after", "reference")]))
    return results


if __name__ == "__main__":
    main()
