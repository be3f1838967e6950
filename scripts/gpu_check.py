"""The GPU check's driver (scripts/gpu_check.sh runs it after installing what the GPU machine lacks).

Stages: those of benchmarks/stages.py that run on the GPU (`--list` prints them; run_all.py reads
the same table for the CPU benchmarks): the device tests (pytest -m device), the Transformer-small
and -base training steps and beam-5 translation against Marian, the RNN step against JoeyNMT, and
a short accelerate-launched training run. Each runs as a subprocess with its own time limit, each
written to the results as soon as it ends (so a run cut short still leaves everything before the
cut).

`--dry-run` runs the same stages on the CPU with tiny sizes (a rehearsal, and what CI runs).
Results: <out>/gpu_check.json and <out>/gpu_check.md (out: $OUT when set, else runs/gpu-check/).
The benchmarks' own JSON (runs/gpu-check/bench/) and each stage's log (runs/gpu-check/logs/) stay in
runs/gpu-check/; when <out> is elsewhere it also gets them as one gpu_check_logs.tar.gz (the device
tool brings back at most 8 files).

    python scripts/gpu_check.py [--dry-run] [--out DIR] [--data DIR] [--only STAGE ...] [--list]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))  # benchmarks/stages.py: the stage table (standard library only)

from stages import stages, table  # noqa: E402  (after the sys.path line)

STAGE_TABLE = stages("gpu")  # name -> Stage, in the order they run
STAGES = tuple(STAGE_TABLE)

# Issue 33's goals on the H200, each against its peer in the same run.
GOALS = {
    "train_step_small": 1.2,  # ours / Marian tokens/s, bf16, 16k-token batches
    "train_step_base": 1.2,
    "mfu_peak_base": 0.25,  # Transformer-base against the measured bf16 matmul peak
    "generate_beam5": 1.2,
    "rnn": 1.5,
}


def log(msg: str) -> None:
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


# ------------------------------------------------------------------------------------------------
# Running one stage
# ------------------------------------------------------------------------------------------------


def run_stage(name: str, command: list[str], timeout: float, logs: Path, env: dict) -> dict:
    """Run `command`, its output teed to logs/<name>.log; {'rc', 'seconds', 'timed_out', 'tail'}."""
    log(f"{name}: {' '.join(command)}")
    start = time.perf_counter()
    with open(logs / f"{name}.log", "w") as out:
        try:
            proc = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        except OSError as exc:  # e.g. no accelerate on PATH
            out.write(f"{exc}\n")
            return {"rc": 127, "seconds": 0.0, "timed_out": False, "last_line": str(exc)}

        # The stage's whole process group (accelerate's children too) goes at the deadline, even
        # while the stage prints nothing.
        def kill() -> None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # ended just now
                pass

        killer = threading.Timer(timeout, kill)
        killer.start()
        try:
            for line in proc.stdout:  # streamed, so the session's own log shows progress
                out.write(line)
                out.flush()
                if (
                    line.startswith(("|", "[bench]", "ratio", "matmul", "=", "FAILED", "ERROR"))
                    or " passed" in line
                    or "updates/s" in line
                    or "Traceback" in line
                ):
                    print(f"  {name}> {line.rstrip()}", flush=True)
            proc.wait()
        finally:
            killer.cancel()
    timed_out = proc.returncode == -signal.SIGKILL and time.perf_counter() - start >= timeout
    seconds = time.perf_counter() - start
    tail = (logs / f"{name}.log").read_text(errors="replace").strip().splitlines()[-1:] or [""]
    status = "timed out" if timed_out else f"rc {proc.returncode}"
    log(f"{name}: {status} after {seconds:.0f} s")
    return {"rc": proc.returncode, "seconds": round(seconds, 1), "timed_out": timed_out, "last_line": tail[0][-300:]}


# ------------------------------------------------------------------------------------------------
# What each stage reports
# ------------------------------------------------------------------------------------------------


def read_junit(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    failed = [
        f"{c.get('classname')}::{c.get('name')}"
        for s in suites
        for c in s.iter("testcase")
        if c.find("failure") is not None or c.find("error") is not None
    ]
    return {**counts, "failed_tests": failed[:20]}


def train_step_figures(payload: dict, model: str) -> dict:
    tok = payload["tokens_per_s"]
    return {
        "model": model,
        "params_ours": payload["params"]["ours"],
        "tokens_per_s_ours": tok["ours"]["median"],
        "tokens_per_s_marian": tok["marian"]["median"],
        "ratio_ours_over_marian": payload["ratio_ours_over_marian"]["median"],
        "ratio_iqr": [payload["ratio_ours_over_marian"]["q1"], payload["ratio_ours_over_marian"]["q3"]],
        "mfu_peak_ours": payload["mfu_peak"]["ours"]["median"],
        "mfu_peak_marian": payload["mfu_peak"]["marian"]["median"],
        "mfu_own_gemms_ours": payload["mfu"]["ours"]["median"],
        "matmul_peak_tflops": payload["matmul_peak_flops_per_s"]["median"] / 1e12,
        "achieved_tflops_ours": payload["achieved_flops_per_s"]["ours"]["median"] / 1e12,
        "target_tokens_per_round": payload["target_tokens_per_round"],
        "rounds": payload["rounds"],
    }


def generate_figures(payload: dict) -> dict:
    res = payload["results"]["beam5"]
    return {
        "sentences_per_s_ours": res["sentences_per_s"]["ours"]["median"],
        "sentences_per_s_marian": res["sentences_per_s"]["marian"]["median"],
        "ratio_ours_over_marian": res["ratio_ours_over_marian"]["median"],
        "ratio_iqr": [res["ratio_ours_over_marian"]["q1"], res["ratio_ours_over_marian"]["q3"]],
        "sentences": payload["sentences"],
        "new_tokens_per_sentence": payload["new_tokens_per_sentence"],
    }


def rnn_figures(payload: dict) -> dict:
    out = {"joeynmt": payload.get("joeynmt", {})}
    for attention, res in payload["results"].items():
        out[f"{attention}_tokens_per_s_ours"] = res["tokens_per_s"]["ours"]["median"]
        if "joeynmt" in res["tokens_per_s"]:
            out[f"{attention}_tokens_per_s_joeynmt"] = res["tokens_per_s"]["joeynmt"]["median"]
            out[f"{attention}_ratio_ours_over_joeynmt"] = res["ratio_ours_over_joeynmt"]["median"]
    return out


def training_figures(run_dir: Path) -> dict:
    metrics = json.loads((run_dir / "metrics.json").read_text())
    train = metrics["train"]
    history = train["loss_history"]
    test = next(iter(metrics.get("test", {}).values()), {})
    return {
        "updates": train["steps"],
        "train_time_s": train["train_time_s"],
        "updates_per_s": train["steps"] / max(1e-9, train["train_time_s"]),
        "target_tokens_per_s": train["target_tokens_per_s"],
        "first_loss": history[0][1] if history else None,
        "last_loss": history[-1][1] if history else None,
        "loss_falls": bool(history) and history[-1][1] < history[0][1],
        "loss_history": history,
        "mixed_precision": train["mixed_precision"],
        "stopped_by": train["stopped_by"],
        "num_parameters": train["num_parameters"],
        "test_bleu": test.get("bleu"),
        "test_num_sentences": test.get("num_sentences"),
        "test_num_beams": test.get("num_beams"),
    }


# ------------------------------------------------------------------------------------------------
# The stages' commands, full size (GPU) or tiny (dry run)
# ------------------------------------------------------------------------------------------------


def joeynmt_python(dry_run: bool, env: dict) -> tuple[str | None, str]:
    """A python that imports joeynmt.model, and how it was found; (None, reason) if none does."""
    candidates = [os.environ.get("JOEYNMT_PYTHON"), sys.executable]
    if dry_run:
        candidates.insert(1, str(REPO / ".venv-joeynmt" / "bin" / "python"))
    for python in filter(None, candidates):
        if os.sep in python and not Path(python).exists():
            continue
        probe = subprocess.run(
            [python, "-c", "import joeynmt.model, joeynmt.vocabulary"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            return python, f"joeynmt imported by {python}"
    return None, (
        "JoeyNMT is not importable here (no .venv-joeynmt, no $JOEYNMT_PYTHON): the RNN benchmark "
        "ran our side alone; `bash benchmarks/joeynmt_env.sh` makes it available (on the GPU it "
        "comes from the carried wheel)"
    )


def accelerate_launch() -> list[str]:
    """`accelerate launch` of this interpreter: the console script beside it, else the one on PATH,
    else the same command as a module."""
    sibling = Path(sys.executable).parent / "accelerate"
    if sibling.exists():
        return [str(sibling), "launch"]
    if shutil.which("accelerate"):
        return [shutil.which("accelerate"), "launch"]
    return [sys.executable, "-m", "accelerate.commands.launch"]


def cpu_computes_bf16() -> bool:
    """Whether this CPU has bf16 arithmetic (AVX512-BF16 or AMX): elsewhere torch emulates bf16 matrix
    multiplies, tens of times slower (an AVX2-only AMD EPYC ran the dry run's Transformer-base step past
    its 240 s limit)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def commands(args, out: Path, env: dict, joey: str | None) -> tuple[dict, Path]:
    """{stage: (command, time limit)} of every stage of the table, full size (GPU) or tiny (dry
    run), and the training stage's output folder."""
    dry = args.dry_run
    run_dir = REPO / "runs" / "gpu-check" / ("train-dry-run" if dry else "train")
    values = dict(
        python=sys.executable,
        device="cpu" if dry else "cuda",
        # The GPU run benchmarks in bf16; a dry run does too where the CPU computes bf16, else in float32
        # (the training stage keeps bf16 either way: its model is tiny).
        precision="bf16" if not dry or cpu_computes_bf16() else "no",
        joeynmt_python=joey or "none",
        junit_xml=str(out / "logs" / "tests.xml"),
        corpus=f"multi30k:{Path(env['ATTN_SEQ2SEQ_SHARED_DATA']) / 'multi30k'}:de-en",
        run_dir=str(run_dir),
        accelerate_launch=accelerate_launch(),
        accelerate_cpu=["--cpu"] if dry else [],
    )
    return {name: (stage.argv(dry, **values), stage.limit(dry)) for name, stage in STAGE_TABLE.items()}, run_dir


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


def goal_rows(sections: dict) -> list[dict]:
    rows = []

    def add(metric, value, goal, section):
        if finite(value):
            rows.append({"metric": metric, "value": value, "goal": goal, "met": value >= goal, "section": section})

    for model in ("small", "base"):
        s = sections.get(f"train_step_{model}", {}).get("figures", {})
        add(
            f"Transformer-{model} bf16 step, ours/Marian tokens/s",
            s.get("ratio_ours_over_marian"),
            GOALS[f"train_step_{model}"],
            f"train_step_{model}",
        )
    base = sections.get("train_step_base", {}).get("figures", {})
    add(
        "Transformer-base MFU (measured bf16 matmul peak)",
        base.get("mfu_peak_ours"),
        GOALS["mfu_peak_base"],
        "train_step_base",
    )
    gen = sections.get("generate_beam5", {}).get("figures", {})
    add(
        "beam-5 translation, ours/Marian sentences/s",
        gen.get("ratio_ours_over_marian"),
        GOALS["generate_beam5"],
        "generate_beam5",
    )
    rnn = sections.get("rnn", {}).get("figures", {})
    for attention in ("luong", "bahdanau"):
        add(
            f"RNN {attention} step, ours/JoeyNMT tokens/s",
            rnn.get(f"{attention}_ratio_ours_over_joeynmt"),
            GOALS["rnn"],
            "rnn",
        )
    return rows


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"# GPU check{' (DRY RUN on the CPU: tiny sizes, figures not meaningful)' if report['dry_run'] else ''}",
        "",
        f"{report['date_utc']} · {m['device_name']} · torch {m['torch']} · transformers {m['transformers']} · "
        f"accelerate {m['accelerate']} · Python {m['python']} · {report['total_seconds']:.0f} s in all",
        "",
        "| stage | status | seconds | figures |",
        "|---|---|---|---|",
    ]
    for name in STAGES:
        s = report["sections"].get(name)
        if s is None:
            continue
        fig = s.get("figures", {})
        if name == "tests":
            text = (
                (
                    f"{fig['passed']} passed, {fig['failures'] + fig['errors']} failed, {fig['skipped']} skipped"
                    + (f" ({', '.join(fig['failed_tests'])})" if fig["failed_tests"] else "")
                )
                if fig
                else ""
            )
        elif name.startswith("train_step"):
            text = (
                (
                    f"ours {fig['tokens_per_s_ours']:,.0f} tok/s, "
                    f"Marian {fig['tokens_per_s_marian']:,.0f} tok/s, ratio "
                    f"{fig['ratio_ours_over_marian']:.2f}x; MFU (peak {fig['matmul_peak_tflops']:.3g} TFLOP/s) ours "
                    f"{100 * fig['mfu_peak_ours']:.1f}%, Marian {100 * fig['mfu_peak_marian']:.1f}%"
                )
                if fig
                else ""
            )
        elif name == "generate_beam5":
            text = (
                (
                    f"ours {fig['sentences_per_s_ours']:.1f} sent/s, "
                    f"Marian {fig['sentences_per_s_marian']:.1f} sent/s, "
                    f"ratio {fig['ratio_ours_over_marian']:.2f}x"
                )
                if fig
                else ""
            )
        elif name == "rnn":
            parts = []
            for a in ("luong", "bahdanau"):
                if f"{a}_tokens_per_s_ours" in fig:
                    parts.append(
                        f"{a}: ours {fig[f'{a}_tokens_per_s_ours']:,.0f} tok/s"
                        + (
                            f", JoeyNMT {fig[f'{a}_tokens_per_s_joeynmt']:,.0f}, "
                            f"ratio {fig[f'{a}_ratio_ours_over_joeynmt']:.2f}x"
                            if f"{a}_ratio_ours_over_joeynmt" in fig
                            else ", JoeyNMT skipped"
                        )
                    )
            text = "; ".join(parts)
        else:
            text = (
                (
                    f"{fig['updates']} updates in {fig['train_time_s']:.0f} s = {fig['updates_per_s']:.1f} updates/s "
                    f"({fig['target_tokens_per_s']:,.0f} target tok/s, {fig['mixed_precision']}); "
                    f"loss {fig['first_loss']:.3f} -> "
                    f"{fig['last_loss']:.3f}; test BLEU {fig['test_bleu']} "
                    f"(beam {fig['test_num_beams']}, {fig['test_num_sentences']} sentences)"
                )
                if fig
                else ""
            )
        note = s.get("note", "")
        lines.append(f"| {name} | {s['status']} | {s.get('seconds', 0):.0f} | {text}{(' · ' + note) if note else ''} |")
    if report["goals"]:
        heading = "goal (issue 33, paired in this run)" + (": DRY RUN, not meaningful" if report["dry_run"] else "")
        lines += ["", f"| {heading} | value | goal | met |", "|---|---|---|---|"]
        for g in report["goals"]:
            value = f"{100 * g['value']:.1f}%" if "MFU" in g["metric"] else f"{g['value']:.2f}x"
            goal = f"{100 * g['goal']:.0f}%" if "MFU" in g["metric"] else f"{g['goal']}x"
            lines.append(f"| {g['metric']} | {value} | ≥ {goal} | {'yes' if g['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def machine(env: dict) -> dict:
    probe = (
        "import json, platform, torch, transformers, accelerate\n"
        "d = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu: ' + platform.processor()\n"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'device_name': d,"
        " 'transformers': transformers.__version__, 'accelerate': accelerate.__version__}))"
    )
    info = json.loads(
        subprocess.run(
            [sys.executable, "-P", "-c", probe], env=env, cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
    )
    if info["device_name"].startswith("cpu"):
        try:
            model = next(
                line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")
            )
            info["device_name"] = f"cpu: {model}"
        except (OSError, StopIteration):
            pass
    info.update(python=platform.python_version(), host=platform.node(), logical_cpus=os.cpu_count())
    return info


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the same stages on the CPU with tiny sizes")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO / "runs" / "gpu-check"))
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help=(
            "folder holding multi30k/ "
            "(default: .gpu-check/data if prepared, else $ATTN_SEQ2SEQ_SHARED_DATA or ../shared/data)"
        ),
    )
    parser.add_argument("--only", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument("--list", action="store_true", help="print the stages (benchmarks/stages.py) and exit")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for all stages together (default 450 on a GPU: with the install, the 8 minutes "
        "of issue 33; none for a dry run); a stage gets at most what is left, and one with "
        "under 20 s left is skipped",
    )
    args = parser.parse_args(argv)
    if args.list:
        print(table("gpu"))
        return 0

    data = args.data
    if data is None:
        candidates = [
            REPO / ".gpu-check" / "data",
            Path(os.environ.get("ATTN_SEQ2SEQ_SHARED_DATA") or REPO.parent / "shared" / "data"),
        ]
        data = next((c for c in candidates if (c / "multi30k" / "train.de").exists()), candidates[-1])
    if not (data / "multi30k" / "train.de").exists():
        print(
            f"gpu-check: no Multi30k at {data / 'multi30k'} (train/val/test2016 .de/.en): give --data DIR, or run "
            "`scripts/gpu_check.sh --prepare` to copy it into .gpu-check/data",
            file=sys.stderr,
        )
        return 2
    out = args.out.resolve()
    work = REPO / "runs" / "gpu-check"
    for folder in (out, work / "logs", work / "bench"):
        folder.mkdir(parents=True, exist_ok=True)
    for old in [
        *(work / "logs").iterdir(),
        *(work / "bench").iterdir(),
    ]:  # no figure of an earlier run is read as this one's
        old.unlink()
    env = dict(
        os.environ,
        ATTN_SEQ2SEQ_SHARED_DATA=str(data.resolve()),
        BENCH_RESULTS_DIR=str(work / "bench"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
        BENCH_CACHE=str(REPO / ".gpu-check" / "bench-cache"),
    )
    if args.dry_run:
        # One thread: a rehearsal's figures mean nothing, and on a shared CPU two spinning OpenMP
        # threads per process slow everything down many times over.
        env["OMP_NUM_THREADS"] = env["BENCH_THREADS"] = "1"
        env["BENCH_TOKENIZER_PAIRS"] = (
            "3000"  # the benchmarks' tokenizer from 3,000 pairs, not 29,000 (--prepare trains the full one)
        )

    info = machine(env)
    if not args.dry_run and info["device_name"].startswith("cpu"):
        print(
            f"gpu-check: torch {info['torch']} sees no CUDA device here; run it on a GPU machine, or "
            "`scripts/gpu_check.sh --dry-run` for the CPU rehearsal",
            file=sys.stderr,
        )
        return 3
    joey, joey_note = joeynmt_python(args.dry_run, env)
    cmds, run_dir = commands(args, work, env, joey)
    report = {
        "dry_run": args.dry_run,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": info,
        "data": str(data),
        "sections": {},
        "goals": [],
        "total_seconds": 0.0,
    }
    start = time.perf_counter()
    log(f"{'DRY RUN on ' if args.dry_run else ''}{info['device_name']}; results -> {out}")

    def write() -> None:
        report["total_seconds"] = round(time.perf_counter() - start, 1)
        report["goals"] = goal_rows(report["sections"])
        for folder in {work, out}:
            (folder / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
            (folder / "gpu_check.md").write_text(markdown(report))
        if out != work:
            with tarfile.open(out / "gpu_check_logs.tar.gz", "w:gz") as tar:
                tar.add(work / "logs", arcname="logs")
                tar.add(work / "bench", arcname="bench")

    budget = args.budget if args.budget is not None else (None if args.dry_run else 450.0)
    for name in args.only:
        command, timeout = cmds[name]
        if budget is not None:
            left = budget - (time.perf_counter() - start)
            if left < 20:
                report["sections"][name] = {
                    "status": "skipped",
                    "seconds": 0.0,
                    "figures": {},
                    "note": f"skipped: the {budget:.0f} s budget was spent",
                }
                log(f"{name}: skipped, {left:.0f} s of the budget left")
                write()
                continue
            timeout = min(timeout, left)
        stage_env = dict(env, **STAGE_TABLE[name].env)
        if name == "training":
            shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time (the trainer refuses a used folder)
        result = run_stage(name, command, timeout, work / "logs", stage_env)
        section = {
            "status": "ok" if result["rc"] == 0 and not result["timed_out"] else "failed",
            **result,
            "command": command,
        }
        try:
            if name == "tests":
                section["figures"] = read_junit(work / "logs" / "tests.xml")
            elif name == "training":
                section["figures"] = training_figures(run_dir)
            else:
                payload = json.loads((work / "bench" / f"{name}.json").read_text())
                section["figures"] = (
                    train_step_figures(payload, name.split("_")[-1])
                    if name.startswith("train_step")
                    else generate_figures(payload)
                    if name == "generate_beam5"
                    else rnn_figures(payload)
                )
            if name == "rnn" and joey is None:
                section["note"] = joey_note
        except (OSError, KeyError, ValueError, ET.ParseError) as exc:
            section["status"] = "failed"
            section["error"] = f"no figures: {type(exc).__name__}: {exc}"
        report["sections"][name] = section
        write()
    write()
    print((out / "gpu_check.md").read_text(), flush=True)
    log(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}")
    return 0 if all(s["status"] == "ok" for s in report["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
