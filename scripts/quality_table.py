"""The README's results table and docs/results.md's run table, generated from training run folders.

Usage (from the repository root, after ``attention-seq2seq train --recipe training/recipes/<name>.yaml``):

    python scripts/quality_table.py RUN_DIR...                          # print the README table
    python scripts/quality_table.py --style full RUN_DIR...             # print docs/results.md's table
    python scripts/quality_table.py --write README.md RUN_DIR...        # replace the README's table
    python scripts/quality_table.py --style full --write docs/results.md RUN_DIR...
    python scripts/quality_table.py --earlier multi30k-rnn-luong=41.6 RUN_DIR...   # a column: then and now

Every cell is read from the run folder: ``metrics.json`` (its ``run`` section names the commit, the
host and the command that produced the run; ``train`` the updates and the time; ``test`` the
scores) and ``recipe.yaml``. A row says which recipe it ran and every option given beside
``--recipe`` except those that change no result (``--output_dir``, ``--num_threads``, ``--resume``),
so a row produced by a recipe *not* as shipped shows how it differs; a run from a checkout with
uncommitted changes shows ``+dirty`` after its commit. A run folder written before metrics.json
had a ``run`` section shows "unrecorded" for the commit and the host.

``--write FILE`` replaces what lies between the lines ``<!-- quality-table:STYLE:begin -->`` and
``<!-- quality-table:STYLE:end -->`` (STYLE ``readme`` or ``full``) and leaves the rest of the
file as it was.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path

import yaml

# Options of the training command that change how fast a run goes or where it writes, not the model.
NEUTRAL_OPTIONS = ("--output_dir", "--num_threads", "--resume", "--log_with")

STYLES = {
    "readme": (
        "| corpus, test set | recipe | commit | date, host | work (time) | params | BLEU beam 5 | BLEU greedy "
        "| chrF | TER |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ),
    "full": (
        "| recipe | commit | finished (UTC), host | updates (epochs) | time | train tok/s | params | BLEU beam 5 "
        "| BLEU greedy | BLEU lc beam 5 | chrF beam 5 | TER beam 5 |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ),
}


def _read(run_dir: Path) -> tuple[dict, dict]:
    for name in ("metrics.json", "recipe.yaml"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir / name} is missing: is {run_dir} a finished training run?")
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    recipe = yaml.safe_load((run_dir / "recipe.yaml").read_text(encoding="utf-8")) or {}
    return metrics, recipe


def recipe_cell(run_dir: Path, metrics: dict) -> str:
    """The recipe's name and the options given beside it that change the result, e.g.
    ```multi30k-rnn-luong``` or ```multi30k-transformer-small` --seed 7`` (the run folder's name
    where the command is unrecorded)."""
    command = (metrics.get("run") or {}).get("command")
    if not command or "--recipe" not in command:
        return f"`{run_dir.name}`"
    words = list(command)
    at = words.index("--recipe")
    name = Path(words[at + 1]).stem if at + 1 < len(words) else run_dir.name
    del words[at : at + 2]
    extra, i = [], 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            value = None
            if "=" not in word and i + 1 < len(words) and not words[i + 1].startswith("--"):
                value = words[i + 1]
                i += 1
            if option not in NEUTRAL_OPTIONS:
                extra.append(word if value is None else f"{word} {value}")
        i += 1
    return f"`{name}`" + (f" {' '.join(extra)}" if extra else "")


def host_cell(metrics: dict) -> str:
    """``2-core Intel Xeon, 1 thread`` (threads: torch's intra-op threads the run used), or the GPU."""
    run = metrics.get("run") or {}
    host = run.get("host") or {}
    if not host:
        return "unrecorded"
    if host.get("gpu"):
        return host["gpu"]
    cpu = re.sub(r"\((R|TM|tm)\)|CPU|Processor|\d+-Core", "", host.get("cpu") or "CPU")
    cpu = re.sub(r"@.*", "", cpu)
    cpu = " ".join(cpu.split())
    threads = metrics.get("train", {}).get("num_threads")
    text = f"{host.get('logical_cpus')}-core {cpu}" if host.get("logical_cpus") else cpu
    return text + (f", {threads} thread{'s' if threads != 1 else ''}" if threads else "")


def commit_cell(metrics: dict) -> str:
    run = metrics.get("run") or {}
    if not run.get("commit"):
        return "unrecorded"
    return f"`{run['commit'][:7]}`" + ("+dirty" if run.get("dirty") else "")


def _date(metrics: dict, with_time: bool = False) -> str:
    finished = (metrics.get("run") or {}).get("finished_utc")
    if not finished:
        return "unrecorded"
    moment = datetime.fromisoformat(finished)
    return moment.strftime("%Y-%m-%d %H:%M" if with_time else "%Y-%m-%d")


def _score(entry: dict | None, key: str, ci: bool = False) -> str:
    if entry is None or key not in entry:
        return "-"
    text = f"{entry[key]:.1f}"
    if ci and f"{key}_ci95" in entry:
        text += f" ± {entry[f'{key}_ci95']:.1f}"
    return text


def _test_entries(metrics: dict) -> tuple[str, dict, dict | None]:
    tests = metrics["test"]
    name = next(k for k in tests if not k.endswith("-greedy"))
    return name, tests[name], tests.get(f"{name}-greedy")


def row(run_dir: Path, style: str = "readme", earlier: dict | None = None) -> str:
    """One Markdown row for a finished run folder; with ``earlier`` (recipe name -> the BLEU reported
    for it before), a last column with that figure and the difference.

    Raises:
        FileNotFoundError: ``run_dir`` has no metrics.json or recipe.yaml (the run did not finish).
        ValueError: an unknown ``style``.
    """
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; valid: {', '.join(STYLES)}")
    metrics, recipe = _read(Path(run_dir))
    train = metrics["train"]
    name, beam, greedy = _test_entries(metrics)
    minutes = f"{train['wall_time_s'] / 60:.0f} min"
    params = f"{train['num_parameters'] / 1e6:.2f} M"
    if style == "readme":
        corpus = metrics.get("corpus") or {}
        where = corpus.get("name") or name
        if corpus.get("source_lang") and corpus.get("target_lang"):
            where += f" {corpus['source_lang']}→{corpus['target_lang']}"
        cells = [
            f"{where}, {beam.get('split', 'test')} ({beam['num_sentences']:,})",
            recipe_cell(Path(run_dir), metrics),
            commit_cell(metrics),
            f"{_date(metrics)}, {host_cell(metrics)}",
            f"{train['steps']:,} updates ({minutes})",
            params,
            f"**{_score(beam, 'bleu', ci=True)}**",
            _score(greedy, "bleu"),
            _score(beam, "chrf"),
            _score(beam, "ter"),
        ]
    else:
        cells = [
            recipe_cell(Path(run_dir), metrics),
            commit_cell(metrics),
            f"{_date(metrics, with_time=True)}, {host_cell(metrics)}",
            f"{train['steps']:,} ({train['epochs']:.1f})",
            minutes,
            f"{train['target_tokens_per_s']:,.0f}",
            params,
            _score(beam, "bleu", ci=True),
            _score(greedy, "bleu"),
            _score(beam, "bleu_lowercase"),
            _score(beam, "chrf"),
            _score(beam, "ter"),
        ]
    if earlier is not None:
        name = recipe_cell(Path(run_dir), metrics).split("`")[1]
        before = earlier.get(name)
        cells.append("-" if before is None else f"{before:.1f} ({beam['bleu'] - before:+.1f})")
    return "| " + " | ".join(cells) + " |"


def table(run_dirs, style: str = "readme", earlier: dict | None = None) -> str:
    """The whole Markdown table (header, separator, one row per run folder, in the order given)."""
    header, rule = STYLES[style]
    if earlier is not None:
        header, rule = header + " earlier BLEU (change) |", rule + "---:|"
    return "\n".join([header, rule, *(row(Path(d), style, earlier) for d in run_dirs)])


def parse_earlier(values) -> dict:
    """``--earlier NAME=BLEU`` values as {recipe name: BLEU}.

    Raises:
        ValueError: a value without ``=`` or whose BLEU is not a number (naming the value).
    """
    earlier = {}
    for value in values or ():
        name, _, number = value.partition("=")
        try:
            earlier[name.strip()] = float(number)
        except ValueError:
            raise ValueError(f"--earlier {value!r}: give RECIPE=BLEU, e.g. multi30k-rnn-luong=41.6") from None
    return earlier


def replace_block(text: str, style: str, new_table: str, path: str = "the file") -> str:
    """``text`` with the lines between its ``quality-table:STYLE`` markers replaced by ``new_table``.

    Raises:
        ValueError: the markers are missing or out of order (naming ``path`` and the markers).
    """
    begin, end = f"<!-- quality-table:{style}:begin -->", f"<!-- quality-table:{style}:end -->"
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"{path}: needs one line {begin} and, after it, one line {end} around the table")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{new_table}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="finished training run folders, in table order")
    parser.add_argument("--style", choices=sorted(STYLES), default="readme")
    parser.add_argument("--write", type=Path, help="replace the table between the file's quality-table markers")
    parser.add_argument(
        "--earlier",
        action="append",
        metavar="RECIPE=BLEU",
        help="the BLEU reported for a recipe before (repeatable): adds a column with it and the change",
    )
    args = parser.parse_args(argv)
    try:
        new_table = table(args.runs, args.style, parse_earlier(args.earlier) if args.earlier else None)
        if args.write is None:
            print(new_table)
            return 0
        text = args.write.read_text(encoding="utf-8")
        args.write.write_text(replace_block(text, args.style, new_table, str(args.write)), encoding="utf-8")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(args.runs)} row(s) into {args.write}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
