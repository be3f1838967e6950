"""Reporting: number formats, the Markdown-style tables every benchmark prints, goal rows and
the JSON result files (benchmarks/results/<name>[_quick].json, each with the machine's description)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict
from pathlib import Path

from harness.machine import REPO_ROOT, machine_info

# BENCH_RESULTS_DIR puts the JSON elsewhere (scripts/gpu_check.sh: under its own output folder),
# so a device check never replaces the reference CPU measurements in benchmarks/results/.
RESULTS_DIR = Path(os.environ.get("BENCH_RESULTS_DIR") or Path(__file__).resolve().parents[1] / "results")


def fmt(x: float, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.{digits}f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.{digits}f}k"
    return f"{x:.{digits}f}"


def spread(s: dict, digits: int = 1) -> str:
    return f"[{fmt(s['q1'], digits)} – {fmt(s['q3'], digits)}]"


def print_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    text = "\n".join(
        [f"\n{title}", line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows]
    )
    print(text, flush=True)
    return text


def goal_entry(name: str, ratio: float, goal: float, higher_is_better: bool = True, note: str = "") -> dict:
    met = ratio >= goal if higher_is_better else ratio <= goal
    return {
        "metric": name,
        "ratio": ratio,
        "goal": goal,
        "direction": ">=" if higher_is_better else "<=",
        "met": bool(met),
        "note": note,
    }


def write_result(name: str, payload: dict, quick: bool) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "quick": quick, "machine": machine_info(), **payload}
    path = RESULTS_DIR / (f"{name}{'_quick' if quick else ''}.json")
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    print(f"[bench] wrote {shown}", flush=True)
    return path


def _json_default(obj):
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)
