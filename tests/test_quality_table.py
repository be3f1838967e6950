"""scripts/quality_table.py: the README's and docs/results.md's result tables are read from run
folders (scores, updates, time, and the commit, host and command behind each run), not typed in."""

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


def _fake_run(run: Path, greedy: bool = True, command=None, provenance: bool = True) -> Path:
    run.mkdir()
    entry = {
        "split": "test",
        "num_sentences": 1000,
        "num_beams": 5,
        "bleu": 41.234,
        "bleu_ci95": 1.62,
        "bleu_lowercase": 42.06,
        "chrf": 61.96,
        "ter": 38.04,
    }
    tests = {"multi30k-test": entry}
    if greedy:
        tests["multi30k-test-greedy"] = {**entry, "num_beams": 1, "bleu": 39.95}
    metrics = {
        "corpus": {"name": "Multi30k", "source_lang": "de", "target_lang": "en"},
        "train": {
            "wall_time_s": 2401.0,
            "steps": 6789,
            "epochs": 34.04,
            "target_tokens_per_s": 2665.4,
            "num_parameters": 5_996_544,
            "num_threads": 1,
        },
        "test": tests,
    }
    if provenance:
        metrics["run"] = {
            "commit": "6748ef469ff3634fcbe4d60664ef8fd92d9f64c8",
            "dirty": False,
            "host": {"cpu": "Intel(R) Xeon(R) Processor", "logical_cpus": 2, "gpu": None},
            "command": command
            or ["train.py", "--recipe", "training/recipes/multi30k-rnn-luong.yaml", "--num_threads", "1"],
            "finished_utc": "2026-12-05T16:40:12+00:00",
        }
    (run / "metrics.json").write_text(json.dumps(metrics))
    (run / "recipe.yaml").write_text(yaml.safe_dump({"num_threads": 1}))
    return run


def test_a_readme_row_reads_every_column_from_the_run_folder(tmp_path):
    row = _load_script().row(_fake_run(tmp_path / "run-a"))
    assert row == (
        "| Multi30k de→en, test (1,000) | `multi30k-rnn-luong` | `6748ef4` | 2026-12-05, 2-core Intel Xeon, 1 thread "
        "| 6,789 updates (40 min) | 6.00 M | **41.2 ± 1.6** | 40.0 | 62.0 | 38.0 |"
    )


def test_a_full_row_adds_speed_epochs_and_lower_cased_bleu(tmp_path):
    row = _load_script().row(_fake_run(tmp_path / "run-a"), style="full")
    assert row == (
        "| `multi30k-rnn-luong` | `6748ef4` | 2026-12-05 16:40, 2-core Intel Xeon, 1 thread | 6,789 (34.0) | 40 min "
        "| 2,665 | 6.00 M | 41.2 ± 1.6 | 40.0 | 42.1 | 62.0 | 38.0 |"
    )


def test_options_that_change_the_result_are_shown_beside_the_recipe(tmp_path):
    command = ["attention-seq2seq", "train", "--recipe", "r/multi30k-transformer-small.yaml", "--seed", "7"]
    command += ["--output_dir", "runs/x", "--max_steps=500", "--resume"]
    cell = _load_script().recipe_cell(tmp_path, json.loads(json.dumps({"run": {"command": command}})))
    assert cell == "`multi30k-transformer-small` --seed 7 --max_steps=500"


def test_a_dirty_checkout_and_a_run_without_provenance_say_so(tmp_path):
    module = _load_script()
    dirty = _fake_run(tmp_path / "dirty")
    metrics = json.loads((dirty / "metrics.json").read_text())
    metrics["run"]["dirty"] = True
    (dirty / "metrics.json").write_text(json.dumps(metrics))
    assert "| `6748ef4`+dirty |" in module.row(dirty)
    old = module.row(_fake_run(tmp_path / "old", provenance=False))
    assert "| `old` | unrecorded | unrecorded, unrecorded |" in old


def test_a_row_without_a_greedy_entry_shows_a_dash(tmp_path):
    cells = _load_script().row(_fake_run(tmp_path / "run-b", greedy=False)).split("|")
    assert cells[7].strip() == "**41.2 ± 1.6**" and cells[8].strip() == "-"


def test_write_replaces_only_the_marked_table(tmp_path):
    module = _load_script()
    run = _fake_run(tmp_path / "run-a")
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- quality-table:readme:begin -->\n| old |\n<!-- quality-table:readme:end -->\nafter\n")
    assert module.main(["--write", str(readme), str(run)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n<!-- quality-table:readme:begin -->\n| corpus, test set |")
    assert "| old |" not in text and text.endswith("<!-- quality-table:readme:end -->\nafter\n")
    assert module.row(run) in text


def test_write_without_markers_is_one_line_and_changes_nothing(tmp_path, capsys):
    module = _load_script()
    run = _fake_run(tmp_path / "run-a")
    readme = tmp_path / "README.md"
    readme.write_text("no markers here\n")
    assert module.main(["--write", str(readme), str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {readme}: needs one line <!-- quality-table:readme:begin -->") and "\n" not in err
    assert readme.read_text() == "no markers here\n"


def test_unfinished_run_folder_is_named_in_the_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty/metrics.json is missing: is .*empty a finished training run\?"):
        _load_script().row(tmp_path / "empty")


def test_earlier_figures_get_a_column_with_the_change(tmp_path):
    module = _load_script()
    run = _fake_run(tmp_path / "run-a")
    text = module.table([run], earlier=module.parse_earlier(["multi30k-rnn-luong=41.6", "other=3"]))
    header, _, line = text.splitlines()
    assert header.endswith("| earlier BLEU (change) |") and line.endswith("| 41.6 (-0.4) |")
    with pytest.raises(ValueError, match=r"--earlier 'luong': give RECIPE=BLEU"):
        module.parse_earlier(["luong"])
