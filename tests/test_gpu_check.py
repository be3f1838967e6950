"""scripts/gpu_check.sh: its CPU rehearsal (--dry-run) runs every stage and writes a complete
results file; without a GPU the real run stops with one line, before installing anything."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from helpers import run_process_tree

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"
STAGES = ("tests", "train_step_small", "train_step_base", "generate_beam5", "rnn", "training")


def _numbers(value, path=""):
    """Every number inside a nested dict/list, with its path."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{path}[{i}]")


@pytest.mark.slow
def test_dry_run_writes_every_section_with_finite_figures(shared_data, tmp_path):
    env = dict(
        os.environ, OUT=str(tmp_path), ATTN_SEQ2SEQ_SHARED_DATA=str(shared_data), PYTHON=str(Path(os.sys.executable))
    )
    done = run_process_tree(["bash", str(SCRIPT), "--dry-run"], timeout=900, cwd=REPO_ROOT, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert report["dry_run"] is True and "DRY RUN" in markdown
    assert (tmp_path / "gpu_check_logs.tar.gz").exists()  # logs and benchmark JSON travel as one file
    assert list(report["sections"]) == list(STAGES)
    for name, section in report["sections"].items():
        assert section["status"] == "ok", (name, section)
        figures = dict(_numbers(section["figures"]))
        assert figures, name
        bad = {k: v for k, v in figures.items() if not math.isfinite(v)}
        assert not bad, (name, bad)
        assert f"| {name} | ok |" in markdown
    tests = report["sections"]["tests"]["figures"]
    assert tests["passed"] > 0 and tests["failures"] == tests["errors"] == 0
    for model in ("small", "base"):
        step = report["sections"][f"train_step_{model}"]["figures"]
        assert step["tokens_per_s_ours"] > 0 and step["tokens_per_s_marian"] > 0
        assert 0 < step["mfu_peak_ours"] and step["matmul_peak_tflops"] > 0
    assert (
        report["sections"]["train_step_base"]["figures"]["params_ours"]
        > report["sections"]["train_step_small"]["figures"]["params_ours"]
    )
    assert report["sections"]["generate_beam5"]["figures"]["ratio_ours_over_marian"] > 0
    assert report["sections"]["rnn"]["figures"]["luong_tokens_per_s_ours"] > 0
    training = report["sections"]["training"]["figures"]
    assert training["updates"] == 12 and training["updates_per_s"] > 0 and training["mixed_precision"] == "bf16"
    assert training["loss_falls"] and training["last_loss"] < training["first_loss"]
    # every goal row of the run is a finite ratio against its peer
    assert report["goals"] and all(math.isfinite(g["value"]) for g in report["goals"])


def test_the_real_run_without_a_gpu_stops_with_one_line(tmp_path):
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU: the real run would start")
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=str(Path(os.sys.executable)))
    done = subprocess.run(["bash", str(SCRIPT)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and "sees no CUDA device" in done.stderr and "--dry-run" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert not list(tmp_path.iterdir())  # nothing installed, nothing written


def test_an_unknown_option_is_refused_naming_the_valid_ones():
    done = subprocess.run(["bash", str(SCRIPT), "--dryrun"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "gpu_check.sh: unknown option '--dryrun'; valid: (none), --prepare, --dry-run, --help"
