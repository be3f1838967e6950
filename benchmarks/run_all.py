"""Run every benchmark, then print one summary of every ratio against its goal.

    python benchmarks/run_all.py [--quick] [--threads 2] [--only train_step generate ...]

`--quick` is a smoke test of the harness (a couple of repeats, seconds per benchmark); the numbers
it gives are not meaningful. Each benchmark also runs on its own (see its docstring) and writes
benchmarks/results/<name>[_quick].json; this script adds results/summary[_quick].json.
The RNN benchmark needs the JoeyNMT venv (`bash benchmarks/joeynmt_env.sh`); it is skipped, and
reported as skipped, when that venv is missing.
"""

from __future__ import annotations

import argparse
import importlib
import time
import traceback

from harness.machine import DEFAULT_THREADS, machine_info, set_threads
from harness.results import print_table, write_result

BENCHMARKS = {  # name: (module, extra arguments); issue numbering in the comments; the longest one last
    "train_step": ("bench_train_step", []),  # 1 and 5
    "train_step_bf16": (
        "bench_train_step",
        ["--mixed-precision", "bf16"],
    ),  # 1 and 5 under CPU bf16 autocast (information)
    "generate": ("bench_generate", []),  # 3
    "generate_min_new_tokens": (
        "bench_generate",
        ["--force-length", "min-new-tokens", "--beams", "1"],
    ),  # 3, the first method (information)
    "rnn": ("bench_rnn", []),  # 4
    "rnn_bf16": ("bench_rnn", ["--mixed-precision", "bf16"]),  # 4 with our step under CPU bf16 autocast (information)
    "memory": ("bench_memory", []),  # 6
    "pipeline": ("bench_pipeline", []),  # 2
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    args = parser.parse_args()
    set_threads(args.threads)

    goals, errors, durations = [], {}, {}
    for name in args.only:
        module_name, extra = BENCHMARKS[name]
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
