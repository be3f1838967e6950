"""Print the README's performance table (markdown) from benchmarks/results/*.json.

python benchmarks/report.py [--quick]
"""

from __future__ import annotations

import argparse
import json

from harness.results import RESULTS_DIR


def load(name: str, quick: bool) -> dict | None:
    path = RESULTS_DIR / f"{name}{'_quick' if quick else ''}.json"
    return json.loads(path.read_text()) if path.exists() else None


def iqr(s: dict, digits: int = 0) -> str:
    return f"{s['median']:,.{digits}f} ({s['q1']:,.{digits}f}–{s['q3']:,.{digits}f})"


def rq(r: dict) -> str:
    """A paired ratio: median (inter-quartile range)."""
    return f"{r['median']:.2f}× ({r['q1']:.2f}–{r['q3']:.2f})"


def status(ratio: float, goal: float, higher: bool = True) -> str:
    return "met" if (ratio >= goal if higher else ratio <= goal) else "**not met**"


def dispatch_row(rows: list, r: dict, label: str) -> None:
    """The `ours_sdpa` side of bench_train_step (absent from results written before it existed)."""
    if "ratio_ours_over_ours_sdpa" not in r or "ours_sdpa" not in r["tokens_per_s"]:
        return
    t = r["tokens_per_s"]
    rows.append(
        [
            label,
            iqr(t["ours"]),
            iqr(t["ours_sdpa"]),
            "ours, SDPA at every length (before the dispatch)",
            rq(r["ratio_ours_over_ours_sdpa"]),
            "—",
            "—",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows, machine = [], None

    r = load("train_step", args.quick)
    if r:
        machine = r["machine"]
        t, ratio = r["tokens_per_s"], r["ratio_ours_over_marian"]["median"]
        rows.append(
            [
                "1. Transformer training step, target tokens/s",
                iqr(t["ours"]),
                iqr(t["marian"]),
                "Marian",
                rq(r["ratio_ours_over_marian"]),
                "≥ 1.1×",
                status(ratio, 1.1),
            ]
        )
        m = r["mfu"]
        rows.append(
            [
                "5. Model FLOP utilization (training step)",
                f"{100 * m['ours']['median']:.1f}% ({100 * m['ours']['q1']:.1f}–{100 * m['ours']['q3']:.1f})",
                f"{100 * m['marian']['median']:.1f}% ({100 * m['marian']['q1']:.1f}–{100 * m['marian']['q3']:.1f})",
                "Marian",
                "—",
                "≥ 65%",
                status(m["ours"]["median"], 0.65),
            ]
        )
        dispatch_row(
            rows, r, "1c. our step with the short-sentence attention dispatch vs SDPA at every length (information)"
        )
    r = load("train_step_bf16", args.quick)
    if r:
        machine = machine or r["machine"]
        t, ratio = r["tokens_per_s"], r["ratio_ours_over_marian"]["median"]
        rows.append(
            [
                "1b. same, both under CPU bf16 autocast (for information)",
                iqr(t["ours"]),
                iqr(t["marian"]),
                "Marian, bf16 autocast",
                rq(r["ratio_ours_over_marian"]),
                "(≥ 1.1×)",
                status(ratio, 1.1),
            ]
        )
        m = r["mfu"]
        rows.append(
            [
                "5b. MFU under bf16 autocast, against bf16 matmul (for information)",
                f"{100 * m['ours']['median']:.1f}% ({100 * m['ours']['q1']:.1f}–{100 * m['ours']['q3']:.1f})",
                f"{100 * m['marian']['median']:.1f}% ({100 * m['marian']['q1']:.1f}–{100 * m['marian']['q3']:.1f})",
                "Marian, bf16 autocast",
                "—",
                "(≥ 65%)",
                status(m["ours"]["median"], 0.65),
            ]
        )
        dispatch_row(rows, r, "1d. same as 1c, under CPU bf16 autocast (information)")
    r = load("pipeline", args.quick)
    if r:
        machine = machine or r["machine"]
        t, ratio = r["target_tokens_per_s"], r["ratio_ours_over_marian"]["median"]
        rows.append(
            [
                f"2. Training pipeline, {r['seconds_per_run']:.0f} s runs, non-padding target tokens/s",
                iqr(t["ours"]),
                iqr(t["marian"]),
                "Seq2SeqTrainer + Marian (defaults)",
                rq(r["ratio_ours_over_marian"]),
                "≥ 1.5×",
                status(ratio, 1.5),
            ]
        )
        if "marian_grouped" in t:
            ratio_g = r["ratio_ours_over_marian_grouped"]
            rows.append(
                [
                    "2b. same, peer with group_by_length (for information)",
                    iqr(t["ours"]),
                    iqr(t["marian_grouped"]),
                    "Seq2SeqTrainer + Marian, group_by_length",
                    rq(ratio_g),
                    "(≥ 1.5×)",
                    status(ratio_g["median"], 1.5),
                ]
            )
    translation_rows = (  # (result, row label, goal column): the goal, then the first method for information
        ("generate", "3. Translation {mode}, sentences/s ({tokens} tokens each)", "≥ 1.2×"),
        (
            "generate_min_new_tokens",
            "3b. same, {mode}, length forced by min_new_tokens (first method, for information)",
            "(≥ 1.2×)",
        ),
    )
    for name, label, goal in translation_rows:
        r = load(name, args.quick)
        if not r:
            continue
        machine = machine or r["machine"]
        for mode, res in r["results"].items():
            s, ratio = res["sentences_per_s"], res["ratio_ours_over_marian"]["median"]
            rows.append(
                [
                    label.format(mode=mode, tokens=r["new_tokens_per_sentence"]),
                    iqr(s["ours"], 1),
                    iqr(s["marian"], 1),
                    "Marian generate",
                    rq(res["ratio_ours_over_marian"]),
                    goal,
                    status(ratio, 1.2),
                ]
            )
    r = load("rnn", args.quick)
    if r:
        machine = machine or r["machine"]
        for attention, res in r["results"].items():
            t, ratio = res["tokens_per_s"], res["ratio_ours_over_joeynmt"]["median"]
            label = "Luong general + input feeding" if attention == "luong" else "Bahdanau"
            rows.append(
                [
                    f"4. RNN training step, {label}, target tokens/s",
                    iqr(t["ours"]),
                    iqr(t["joeynmt"]),
                    "JoeyNMT 2.3",
                    rq(res["ratio_ours_over_joeynmt"]),
                    "≥ 1.5×",
                    status(ratio, 1.5),
                ]
            )
    r = load("rnn_bf16", args.quick)
    if r:
        machine = machine or r["machine"]
        for attention, res in r["results"].items():
            t = res["tokens_per_s"]
            label = "Luong" if attention == "luong" else "Bahdanau"
            for peer, peer_label, what in [
                ("joeynmt", "JoeyNMT 2.3, float32 (its CPU setting)", "ours bf16 autocast"),
                ("joeynmt_bf16", "JoeyNMT 2.3 model under bf16 autocast", "both bf16 autocast"),
            ]:
                ratio = res.get(f"ratio_ours_over_{peer}")
                if ratio is None or peer not in t:
                    continue
                rows.append(
                    [
                        f"4b. RNN training step, {label}, {what} (for information)",
                        iqr(t["ours"]),
                        iqr(t[peer]),
                        peer_label,
                        rq(ratio),
                        "(≥ 1.5×)",
                        status(ratio["median"], 1.5),
                    ]
                )
    r = load("memory", args.quick)
    if r:
        machine = machine or r["machine"]
        s = r["summary"]
        key = "first_step_peak_over_baseline_mib"
        ratio = r["ratio_first_step"]
        rows.append(
            [
                "6. Peak memory of a ~4,000-token training step (first step), MiB above baseline RSS",
                f"{s['ours'][key]['median']:.0f} ({s['ours'][key]['min']:.0f}–{s['ours'][key]['max']:.0f})",
                f"{s['marian'][key]['median']:.0f} ({s['marian'][key]['min']:.0f}–{s['marian'][key]['max']:.0f})",
                "Marian",
                f"{ratio:.2f}× (torch allocator: {r['ratio_allocator_steady_step']:.2f}×)",
                "≤ 1.0×",
                status(ratio, 1.0, higher=False),
            ]
        )

    if machine:
        print(
            f"Measured {machine['date_utc']} on {machine['cpu_model']} ({machine['logical_cpus']} logical CPUs), "
            f"{machine['torch_threads']} torch threads, torch {machine['torch']}, "
            f"transformers {machine['transformers']}; "
            "medians with the inter-quartile range in parentheses (min–max for memory); ratio = ours / peer, "
            "paired per round.\n"
        )
    header = ["benchmark", "ours", "peer", "peer is", "ratio ours/peer", "goal", "status"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
