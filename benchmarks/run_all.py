"""Run every benchmark, then print one summary of every ratio against its goal.

    python benchmarks/run_all.py [--quick] [--threads 2] [--only train_step generate ...] [--list]

The benchmarks are the stages of benchmarks/stages.py that run on the CPU (`--list` prints them),
each run in this process to its end, in the table's order.

`--quick` is a smoke test of the harness (a couple of repeats, seconds per benchmark); the numbers
it gives are not meaningful. Each benchmark also runs on its own (see its docstring) and writes
benchmarks/results/<name>[_quick].json; this script adds results/summary[_quick].json.
The RNN benchmark needs the JoeyNMT venv (`bash benchmarks/joeynmt_env.sh`); it is skipped, and
reported as skipped, when that venv is missing.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path

from harness.machine import DEFAULT_THREADS, machine_info, set_threads
from harness.results import print_table, write_result
from stages import stages, table

BENCHMARKS = stages("cpu")  # name -> Stage (benchmarks/stages.py: the table scripts/gpu_check.py reads too)


def module_and_arguments(stage) -> tuple[str, list[str]]:
    """The benchmark module a stage runs in this process, and the arguments it adds."""
    words = stage.argv(python=sys.executable)
    script = stage.script
    return Path(script).stem, words[words.index(script) + 1 :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    parser.add_argument("--list", action="store_true", help="print the stages (benchmarks/stages.py) and exit")
    args = parser.parse_args()
    if args.list:
        print(table("cpu"))
        return
    set_threads(args.threads)

    goals, errors, durations = [], {}, {}
    for name in args.only:
        module_name, extra = module_and_arguments(BENCHMARKS[name])
        module = importlib.import_module(module_name)
        argv = ["--threads", str(args.threads)] + (["--quick"] if args.quick else []) + extra
        print(f"\n=== {name} ({module.__name__}) ===", flush=True)
        start = time.perf_counter()
        try:
            payload = module.main(argv)
            goals += payload.get("goals", [])
        except SystemExit as exc:  # e.g. the JoeyNMT venv is missing
            errors[name] = f"skipped: {exc}"
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
            traceback.print_exc()
            errors[name] = f"{type(exc).__name__}: {exc}"
        durations[name] = time.perf_counter() - start

    rows = [
        [
            g["metric"],
            f"{g['ratio']:.3f}",
            f"{g['direction']} {g['goal']}",
            "met" if g["met"] else "NOT met",
            g.get("note", ""),
        ]
        for g in goals
    ]
    rows += [[name, "-", "-", message, ""] for name, message in errors.items()]
    info = machine_info()
    print_table(
        f"Summary ({info['date_utc']}, {info['cpu_model']}, {args.threads} threads"
        f"{', QUICK: not meaningful' if args.quick else ''})",
        ["metric", "value", "goal", "status", "note"],
        rows,
    )
    write_result(
        "summary", {"goals": goals, "errors": errors, "durations_s": durations, "threads": args.threads}, args.quick
    )


if __name__ == "__main__":
    main()
