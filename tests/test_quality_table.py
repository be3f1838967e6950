"""scripts/quality_table.py: the README's quality table is read from run folders, not typed in."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

SCRIPT = Path(__file__).parents[1] / "scripts" / "quality_table.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("quality_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fake_run(run: Path, greedy: bool) -> Path:
    run.mkdir()
    entry = {
        "split": "test",
        "num_sentences": 1000,
        "num_beams": 5,
        "bleu": 41.234,
        "bleu_lowercase": 42.06,
        "chrf": 61.96,
    }
    tests = {"multi30k-test": entry}
    if greedy:
        tests["multi30k-test-greedy"] = {**entry, "num_beams": 1, "bleu": 39.95}
    metrics = {
        "train": {
            "wall_time_s": 2401.0,
            "steps": 6789,
            "epochs": 34.04,
            "target_tokens_per_s": 2665.4,
            "num_parameters": 5_996_544,
        },
        "test": tests,
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "recipe.yaml").write_text(yaml.safe_dump({"num_threads": 1}))
    return run


def test_row_reads_every_column_from_the_run_folder(tmp_path):
    row = _load_script().row(_fake_run(tmp_path / "run-a", greedy=True))
    assert row == (
        "| run-a | multi30k-test (1000) | 40 min x 1 thread | 6,789 (34.0) | 2,665 | 6.00 M | 41.2 | 40.0 "
        "| 42.1 | 62.0 |"
    )


def test_row_without_a_greedy_entry_shows_a_dash(tmp_path):
    row = _load_script().row(_fake_run(tmp_path / "run-b", greedy=False))
    assert row.split("|")[8].strip() == "-" and row.split("|")[7].strip() == "41.2"


def test_unfinished_run_folder_is_named_in_the_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty/metrics.json is missing: is .*empty a finished training run\?"):
        _load_script().row(tmp_path / "empty")
