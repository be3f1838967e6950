"""The README's first command, in its short form: the whole main job on the built-in Bible.

Train a Luong RNN and a Transformer-small with ``accelerate launch`` (tiny sizes, seconds each),
evaluate on the held-out test chapters, export both, and load each export with
``pipeline("translation", trust_remote_code=True)`` in a process where the package cannot be
imported. It proves the plumbing of the real command, not translation quality.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attention_seq2seq.data.bible import installed_modules

pytestmark = pytest.mark.slow


@pytest.mark.bible
@pytest.mark.skipif(
    not {"spaRV1909eb", "engWEB2015eb"} <= set(installed_modules()),
    reason="needs Debian's sword-text-sparv and sword-text-web (scripts/install.sh installs them)",
)
def test_main_job_quick_runs_end_to_end_and_repeats_itself_bit_for_bit(tmp_path):
    # Prepared corpora go to a cache of this test's own, shared by both runs.
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "ATTENTION_SEQ2SEQ_CACHE": str(tmp_path / "cache"),
    }

    def job(out):
        done = subprocess.run(
            [sys.executable, "-m", "attention_seq2seq.main_job", "--quick", "--output-dir", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        return done, json.loads((out / "summary.json").read_text(encoding="utf-8"))

    out = tmp_path / "job"
    done, summary = job(out)
    # Fixed work: the recipes' updates, whatever the machine's speed; the plan comes first.
    assert [m["steps"] for m in summary["models"]] == [60, 60]
    assert done.stdout.index("60 updates of <= 2048 tokens;") < done.stdout.index("== 3/5 train")
    assert "main job done in" in done.stdout and "(measured)" in done.stdout
    # Quiet: no per-split dataset bars, no echoed Hub-user script, no Accelerate thread hint.
    for noise in ("examples/s]", "sys.modules[", "OMP_NUM_THREADS", "Writing model shards"):
        assert noise not in done.stdout + done.stderr, noise
    # The same command on the same machine gives the same models and the same scores.
    _, again = job(tmp_path / "again")
    for first, second in zip(summary["models"], again["models"]):
        for key in ("steps", "mixed_precision", "bleu", "chrf", "bleu_ci95", "chrf_ci95", "translations"):
            assert first[key] == second[key], (first["model"], key)

    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert [m["model"] for m in summary["models"]] == ["bible-rnn-luong", "bible-transformer-small"]
    for model in summary["models"]:
        assert model["test_set"] and model["test_sentences"] == 40
        assert 0.0 <= model["bleu"] <= 100.0 and 0.0 <= model["chrf"] <= 100.0
        assert model["bleu_signature"].startswith(
            "nrefs:1|bs:1000|seed:12345|case:mixed"
        )  # the recipes set test_bootstrap: 1000
        assert len(model["translations"]) == 3
        assert all(isinstance(t, str) for t in model["translations"].values())
        export = out / "exports" / model["model"]
        config = json.loads((export / "config.json").read_text(encoding="utf-8"))
        assert set(config["auto_map"]) >= {"AutoConfig", "AutoModelForSeq2SeqLM"}
        assert "translation" in config["custom_pipelines"]
        card = (export / "README.md").read_text(encoding="utf-8")
        assert (
            card.startswith("---") and f"{model['bleu']:.2f} ± " in card
        )  # test_bootstrap's interval reaches the card
        assert model["bleu_ci95"] >= 0.0 and model["chrf_ci95"] > 0.0  # ... and the summary
        assert (export / "model.safetensors").exists()
    # The table the job prints is the one it writes.
    table = (out / "summary.md").read_text(encoding="utf-8")
    assert table.splitlines()[0].startswith("| model |") and table in done.stdout
    for model in summary["models"]:
        assert (
            f"| {model['bleu']:.1f} ± {model['bleu_ci95']:.1f} | {model['chrf']:.1f} ± {model['chrf_ci95']:.1f} |"
            in table
        )


def test_progress_relay_shows_each_redraw_and_logs_the_last(tmp_path, capsys):
    # A training bar redraws with carriage returns; a terminal-less run (CI, a log) must still see
    # it move, and the log file keeps only the bar's last state.
    from attention_seq2seq.main_job import _run

    child = (
        "import sys\nfor i in range(3):\n    sys.stderr.write(f'\\rtrain {i}/2'); sys.stderr.flush()\n"
        "sys.stderr.write('\\n'); print('validation @ 2'); print('last line without newline', end='')"
    )
    _run([sys.executable, "-c", child], log=tmp_path / "child.log", show="the child")
    shown = capsys.readouterr().out.splitlines()
    assert shown == [
        "$ the child",
        "train 0/2",
        "train 1/2",
        "train 2/2",
        "validation @ 2",
        "last line without newline",
    ]
    assert (tmp_path / "child.log").read_text().splitlines() == [
        "train 2/2",
        "validation @ 2",
        "last line without newline",
    ]


def test_the_recipes_fix_the_work_and_minutes_is_an_explicit_wall_clock_opt_in():
    from attention_seq2seq.training.config import parse_command_line
    from attention_seq2seq.main_job import MODELS, train_arguments
    from attention_seq2seq.training.train import TrainConfig

    for name, recipe in MODELS:
        fixed = parse_command_line(TrainConfig, train_arguments(name, recipe, quick=False, minutes=None))
        assert fixed.max_steps and fixed.max_time_minutes is None and fixed.schedule == "linear"
        assert fixed.mixed_precision == "auto"
        timed = parse_command_line(TrainConfig, train_arguments(name, recipe, quick=True, minutes=2.5))
        assert timed.max_steps is None and timed.max_time_minutes == 2.5 and timed.schedule == "linear_time"
