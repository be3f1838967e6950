"""benchmarks/stages.py: the one stage table that benchmarks/run_all.py (CPU stages) and
scripts/gpu_check.py (GPU stages) both read. Only the table is checked here; the GPU check's dry
run (tests/test_gpu_check.py) runs its stages."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from helpers import REPO_ROOT


def _stages_module():
    spec = importlib.util.spec_from_file_location("benchmark_stages", REPO_ROOT / "benchmarks" / "stages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while building Stage
    spec.loader.exec_module(module)
    return module


stages = _stages_module()
GPU_VALUES = dict(
    python="python",
    device="cuda",
    precision="bf16",
    joeynmt_python="none",
    junit_xml="out/tests.xml",
    corpus="multi30k:/data/multi30k:de-en",
    run_dir="runs/train",
    accelerate_launch=["accelerate", "launch"],
    accelerate_cpu=[],
)


@pytest.mark.parametrize("stage", stages.STAGES, ids=lambda s: f"{s.runs_on}-{s.name}")
def test_every_stage_runs_a_script_of_the_repository_and_fills_every_placeholder(stage):
    for dry_run in (False, True) if stage.runs_on == "gpu" else (False,):
        words = stage.argv(dry_run, **GPU_VALUES)
        assert words and not any("{" in word or "}" in word for word in words), words
    if stage.script is not None:
        assert (REPO_ROOT / stage.script).is_file(), stage.script
    assert stage.measures


def test_the_gpu_stages_have_limits_and_the_cpu_stages_none():
    for stage in stages.STAGES:
        if stage.runs_on == "gpu":
            assert stage.limit_s > 0 and stage.dry_run_limit_s > 0
        else:
            assert stage.limit_s is None and stage.dry_run_limit_s is None and not stage.gpu_args
    assert list(stages.stages("gpu")) == [
        "tests",
        "train_step_small",
        "train_step_base",
        "generate_beam5",
        "rnn",
        "training",
    ]
    with pytest.raises(ValueError, match="runs_on"):
        stages.stages("tpu")


def test_a_list_placeholder_becomes_zero_or_more_words():
    training = stages.stages("gpu")["training"]
    full = training.argv(False, **GPU_VALUES)
    dry = training.argv(True, **{**GPU_VALUES, "accelerate_cpu": ["--cpu"]})
    assert full[:2] == ["accelerate", "launch"] and "--cpu" not in full
    assert dry.index("--cpu") < dry.index("-m")  # an option of accelerate launch, not of the script
    assert full[full.index("--output_dir") + 1] == "runs/train"


@pytest.mark.parametrize(
    "driver, runs_on", [("benchmarks/run_all.py", "cpu"), ("scripts/gpu_check.py", "gpu")], ids=["run_all", "gpu_check"]
)
def test_both_drivers_list_the_table(driver, runs_on):
    done = subprocess.run(
        [sys.executable, driver, "--list"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == stages.table(runs_on)
    listed = [line.split(" | ")[0].lstrip("| ") for line in done.stdout.splitlines()[2:]]
    assert listed == list(stages.stages(runs_on))
