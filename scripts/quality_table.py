"""Print the README's translation-quality table from training output folders.

Usage (from the repository root, after the runs of training/recipes/<name>.yaml):

    python scripts/quality_table.py runs/multi30k-transformer-small runs/multi30k-rnn-bahdanau ...

One Markdown row per run folder, read from its ``metrics.json`` and ``recipe.yaml`` (docs/DESIGN.md,
"Training output folder"): the recipe, the CPU budget (minutes x threads), updates and epochs,
training speed (target tokens/s), parameters, then cased sacreBLEU with beam 5 and greedy,
lower-cased sacreBLEU and chrF with beam 5. A run folder without a ``-greedy`` test entry (a
recipe without ``test_greedy: true``) shows "-" there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HEADER = (
    "| run (recipe) | test set | CPU budget | updates (epochs) | train tok/s | params | BLEU beam 5 | BLEU greedy "
    "| BLEU lc beam 5 | chrF beam 5 |\n|---|---|---|---|---|---|---|---|---|---|"
)


def row(run_dir: Path) -> str:
    """One Markdown table row for a finished run folder.

    Raises:
        FileNotFoundError: ``run_dir`` has no metrics.json or recipe.yaml (the run did not finish).
    """
    for name in ("metrics.json", "recipe.yaml"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} is missing: is {run_dir} a finished training run?")
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8"))
    train = metrics["train"]
    tests = metrics["test"]
    name = next(k for k in tests if not k.endswith("-greedy"))
    beam, greedy = tests[name], tests.get(f"{name}-greedy")
    threads = train.get("num_threads") or recipe.get("num_threads") or "default"
    budget = f"{train['wall_time_s'] / 60:.0f} min x {threads} thread{'s' if threads != 1 else ''}"

    def fmt(entry, key):
        return "-" if entry is None or key not in entry else f"{entry[key]:.1f}"

    return (
        f"| {run_dir.name} | {name} ({beam['num_sentences']}) | {budget} | {train['steps']:,} ({train['epochs']:.1f}) "
        f"| {train['target_tokens_per_s']:,.0f} | {train['num_parameters'] / 1e6:.2f} M | {fmt(beam, 'bleu')} "
        f"| {fmt(greedy, 'bleu')} | {fmt(beam, 'bleu_lowercase')} | {fmt(beam, 'chrf')} |"
    )


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(HEADER)
    for arg in argv:
        print(row(Path(arg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
