"""Fresh-user faults of `attention-seq2seq train` (issue "Faults"): a recipe value, corpus spec,
tokenizer folder or output folder that cannot train is refused as ONE line naming the field or
option and what would be valid, before the run folder exists, without a traceback.

Each case runs the command line in this process on a recipe that is valid but for the one fault
(checked by the first test), so the refusal takes well under a second; the last tests run the one
or two updates their fault needs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from helpers import TINY_TRANSFORMER, one_line_error, pairs_corpus_spec

from attention_seq2seq.cli import main
from attention_seq2seq.training import objectives
from attention_seq2seq.training.config import RecipeError, config_from_dict, load_recipe
from attention_seq2seq.training.train_config import MIN_VOCAB_SIZE, TrainConfig, check_paths, validate_config

PREFIX = "attention-seq2seq train: error: "
TINY = TINY_TRANSFORMER


def base_recipe() -> dict:
    """A valid recipe of a run of a few seconds (one update)."""
    return dict(
        model_family="transformer",
        model_config=dict(TINY),
        corpus=pairs_corpus_spec(),
        max_train_samples=60,
        vocab_size=400,
        max_source_length=48,
        max_target_length=48,
        max_steps=1,
        eval_every=100,
        save_every=100,
        max_eval_samples=2,
        max_test_samples=2,
        eval_num_beams=1,
        test_num_beams=2,
        num_plot_sentences=0,
        log_with="none",
    )


def refusal(tmp_path: Path, capsys, text: str, *options: str, run: Path | None = None) -> str:
    """Run `train --recipe R --output_dir RUN *options` on the base recipe plus ``text`` (YAML
    lines that override it); assert one line with the program's prefix, no traceback, no run
    folder made; return the message after the prefix."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(base_recipe()) + text, encoding="utf-8")
    run = tmp_path / "run" if run is None else run
    there = os.path.lexists(run)  # a file, or a link, given as the run folder
    line = one_line_error(capsys, main, ["train", "--recipe", str(recipe), "--output_dir", str(run), *options])
    assert line.startswith(PREFIX), line
    assert os.path.lexists(run) == there  # nothing written: the same command runs once the fault is fixed
    return line.removeprefix(PREFIX)


def test_the_base_recipe_passes_every_check(tmp_path):
    """Each refusal below is its fault's, not the base recipe's."""
    config = config_from_dict(TrainConfig, {**base_recipe(), "output_dir": str(tmp_path / "run")})
    validate_config(config)
    assert check_paths(config) == (tmp_path / "run").resolve()
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- A: recipe values

VALUE_FAULTS = {
    "vocab_size 0": (
        "vocab_size: 0\n",
        "vocab_size must be >= 300 (4 special tokens + 256 byte pieces + 40 subwords); got 0",
    ),
    "vocab_size negative": ("vocab_size: -5\n", "vocab_size must be >= 300"),
    "seed -1": ("seed: -1\n", "seed must be in [0, 4294967295] (numpy's seed range); got -1"),
    "seed 2**32": ("seed: 4294967296\n", "seed must be in [0, 4294967295]"),
    "max_source_length 1": ("max_source_length: 1\n", "max_source_length must be >= 2 tokens (a subword and </s>"),
    "max_target_length 0": ("max_target_length: 0\n", "max_target_length must be >= 2 tokens"),
    "max_source_length over the position table": (
        "max_source_length: 2048\n",
        "max_source_length (2048) is longer than the model's position table (model_config.max_position_embeddings",
    ),
    "learning_rate inf": ("learning_rate: .inf\n", "learning_rate must be a finite number; got inf"),
    "learning_rate nan": ("learning_rate: .nan\n", "learning_rate must be a finite number; got nan"),
    "adam_epsilon 0": ("adam_epsilon: 0\n", "adam_epsilon must be > 0 (1e-8 is usual); got 0.0"),
    "adam_epsilon inf": ("adam_epsilon: .inf\n", "adam_epsilon must be a finite number; got inf"),
    "length_penalty nan": ("length_penalty: .nan\n", "length_penalty must be a finite number; got nan"),
    "length_penalty inf": ("length_penalty: .inf\n", "length_penalty must be a finite number; got inf"),
    "weight_decay inf": ("weight_decay: .inf\n", "weight_decay must be a finite number; got inf"),
    "max_grad_norm nan": ("max_grad_norm: .nan\n", "max_grad_norm must be a finite number; got nan"),
    "rdrop_alpha inf": ("rdrop_alpha: .inf\n", "rdrop_alpha must be a finite number; got inf"),
    "max_epochs inf": ("max_epochs: .inf\n", "max_epochs must be a finite number (or null); got inf"),
    "model_config dropout nan": ("model_config: {dropout: .nan}\n", "model_config.dropout must be a finite number"),
    "plateau_factor 1": ("schedule: plateau\nplateau_factor: 1.0\n", "plateau_factor must be in (0, 1); got 1.0"),
    "corpus kind": ("corpus: nosuchkind:x\n", "corpus: unknown corpus kind 'nosuchkind'"),
    "corpus option": ("corpus: text:x:de-en:colour=red\n", "corpus: unknown option(s) colour for corpus kind 'text'"),
    "corpus pair": ("corpus: text:x:german\n", "corpus: expected a language pair like de-en"),
    "tokenizer_path empty": ("tokenizer_path: ''\n", "tokenizer_path is empty"),
}


@pytest.mark.parametrize("name", sorted(VALUE_FAULTS))
def test_a_value_that_cannot_train_is_one_line_before_the_run_folder_exists(tmp_path, capsys, name):
    text, message = VALUE_FAULTS[name]
    assert message in refusal(tmp_path, capsys, text)


def test_the_vocabulary_minimum_is_the_tokenizer_trainers():
    from attention_seq2seq.data.tokenization import BYTE_PIECES, SPECIAL_TOKENS

    assert MIN_VOCAB_SIZE == len(SPECIAL_TOKENS) + len(BYTE_PIECES) + 40
    with pytest.raises(RecipeError, match="vocab_size must be >= 1"):  # unused with a saved tokenizer, still not 0
        validate_config(TrainConfig(max_steps=1, tokenizer_path="saved", vocab_size=0))
    validate_config(TrainConfig(max_steps=1, tokenizer_path="saved", vocab_size=1))


def test_a_seed_leaves_room_for_every_rank(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(RecipeError, match=r"seed must be in \[0, 4294967292\] .*each of the 4 ranks"):
        validate_config(TrainConfig(max_steps=1, seed=2**32 - 2))
    validate_config(TrainConfig(max_steps=1, seed=2**32 - 4))


def test_a_corpus_location_that_does_not_exist_is_named(tmp_path, capsys):
    missing = tmp_path / "no-such-corpus"
    line = refusal(tmp_path, capsys, f"corpus: text:{missing}:de-en\n")
    assert line == f"corpus text:{missing}:de-en: location {missing} is not a folder nor a prefix of {missing}.de"
    line = refusal(tmp_path, capsys, f"corpus: tsv:{missing}\n")
    assert line == f"corpus tsv:{missing}: location {missing} not found (a folder or a file)"
    line = refusal(tmp_path, capsys, "corpus: multi30k:no/such/multi30k\n")
    assert "location no/such/multi30k is not a folder" in line and f"working directory {os.getcwd()}" in line
    assert "location ./no/such not found" in refusal(tmp_path, capsys, "corpus: hf:./no/such\n")


def test_a_missing_tokenizer_path_says_it_does_not_exist(tmp_path, capsys):
    """Before: the Hugging Face Hub's "Repo id must be in the form 'repo_name'", after the run folder was made."""
    missing = tmp_path / "no-such-tokenizer"
    line = refusal(tmp_path, capsys, f"tokenizer_path: {missing}\n")
    assert line.startswith(f"tokenizer_path {missing} does not exist: give a tokenizer folder saved by save_pretrained")
    (tmp_path / "file").write_text("x")
    assert "is a file; give the folder holding its tokenizer.json" in refusal(
        tmp_path, capsys, f"tokenizer_path: {tmp_path / 'file'}\n"
    )
    (tmp_path / "empty").mkdir()
    assert f"tokenizer_path {tmp_path / 'empty'} holds no tokenizer.json" in refusal(
        tmp_path, capsys, f"tokenizer_path: {tmp_path / 'empty'}\n"
    )


# ----------------------------------------------------------------------------- B: --output_dir


def test_an_empty_output_dir_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump(base_recipe()), encoding="utf-8")
    before = sorted(os.listdir(tmp_path))
    line = one_line_error(capsys, main, ["train", "--recipe", str(recipe), "--output_dir", ""])
    assert line.startswith(PREFIX + "--output_dir is empty: give a folder name for the run"), line
    assert sorted(os.listdir(tmp_path)) == before  # nothing written into the current folder


def test_an_output_dir_that_is_a_file_is_refused(tmp_path, capsys):
    """Before: "[Errno 17] File exists"."""
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    assert refusal(tmp_path, capsys, "", run=afile) == f"--output_dir {afile} is a file; give a folder"
    assert afile.read_text() == "keep me\n"
    under = afile / "run"
    assert refusal(tmp_path, capsys, "", run=under) == f"--output_dir {under}: Not a directory"


def test_an_output_dir_that_is_a_link_loop_or_too_long_is_one_line(tmp_path, capsys):
    """Before: a RuntimeError traceback from Path.resolve() (the loop), an OSError after the
    checks (the long name)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert refusal(tmp_path, capsys, "", run=loop) == f"--output_dir {loop}: Too many levels of symbolic links"
    long = tmp_path / ("x" * 300)
    assert refusal(tmp_path, capsys, "", run=long) == f"--output_dir {long}: File name too long"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    assert "is a symbolic link to" in refusal(tmp_path, capsys, "", run=dangling)


# ----------------------------------------------------------------------------- C: the recipe file


def test_a_recipe_that_is_not_utf8_names_the_option_file_and_line(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_bytes(b"max_steps: 3\nseed: 1\n\xff\xfe\n")
    run = tmp_path / "run"
    line = one_line_error(capsys, main, ["train", "--recipe", str(recipe), "--output_dir", str(run)])
    assert (
        line
        == f"{PREFIX}--recipe {recipe} line 3: not UTF-8 text; a recipe is a YAML or JSON text file, saved as UTF-8"
    )
    assert not run.exists()


def test_recipe_errors_carry_the_program_prefix_and_the_module_entry_keeps_its_own(tmp_path, capsys):
    from attention_seq2seq.training.train import main as train_main

    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 0\n", encoding="utf-8")
    line = one_line_error(capsys, main, ["train", "--recipe", str(recipe)])
    assert line == PREFIX + "max_steps must be > 0 (or null: no such limit); got 0"
    with pytest.raises(SystemExit) as stopped:  # python -m attention_seq2seq.training.train (accelerate launch)
        train_main(["--recipe", str(recipe)])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.strip() == "error: max_steps must be > 0 (or null: no such limit); got 0"


def test_shipped_recipes_still_pass_the_value_checks():
    recipes = Path(__file__).resolve().parents[1] / "training" / "recipes"
    for path in sorted(recipes.glob("*.yaml")):
        if not path.name.startswith("finetune-"):
            validate_config(config_from_dict(TrainConfig, load_recipe(path)))


# ----------------------------------------------------------------------------- after the data is read


@pytest.fixture
def fresh_log_handlers(monkeypatch):
    """The trainer's log handler writes to the stderr of the test that made it (capsys closes
    it): each run here gets its own, and the earlier one comes back afterwards."""
    import logging

    for name in ("attention_seq2seq.training", "attention_seq2seq.data"):
        monkeypatch.setattr(logging.getLogger(name), "handlers", [])


def late_error(capsys, argv: list[str]) -> str:
    """The one error line of a run stopped after it started (its log lines come before it)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(PREFIX), lines[0]
    return lines[0].removeprefix(PREFIX)


def test_length_limits_that_leave_no_training_pair_are_one_line_naming_both(tmp_path, capsys, fresh_log_handlers):
    """Only the tokenized data shows that no pair fits (2 tokens hold one subword and </s>): the
    run stops after the corpus is prepared, naming both limits, instead of the sampler's "lengths
    must be a non-empty array"."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**base_recipe(), "max_source_length": 2}), encoding="utf-8")
    line = late_error(capsys, ["train", "--recipe", str(recipe), "--output_dir", str(tmp_path / "run")])
    assert line.startswith("max_source_length 2 / max_target_length 48 leave no training pair: all 60 pairs")
    assert not (tmp_path / "run").exists()  # the folder this run made is removed with it


def test_a_non_finite_loss_before_any_checkpoint_names_no_checkpoint_folder(
    tmp_path, capsys, monkeypatch, fresh_log_handlers
):
    """Before: "the last good checkpoint is kept in <run>/checkpoints", a folder that did not exist."""
    real_loss = objectives.token_loss_sum

    def nan_loss(*args, **kwargs):
        return real_loss(*args, **kwargs) * float("nan") if torch.is_grad_enabled() else real_loss(*args, **kwargs)

    monkeypatch.setattr(objectives, "token_loss_sum", nan_loss)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**base_recipe(), "log_every": 1}), encoding="utf-8")
    run = tmp_path / "run"
    line = late_error(capsys, ["train", "--recipe", str(recipe), "--output_dir", str(run)])
    assert line.startswith("training loss is not finite at update 1; no checkpoint was written before it")
    assert "checkpoints" not in line and not (run / "checkpoints").exists()


RECIPE_FAULTS = {
    "YAML syntax": (b"max_steps: 3\nmodel_config: {d_model: 32\n", "r.yaml line 3 column 1: not valid YAML"),
    "JSON syntax": (b'{"max_steps": 3,\n "seed": }\n', "r.json line 2 column 10: not valid JSON"),
    "binary": (b"max_steps: 3\n\x89PNG\r\n\x1a\n\x00\xff", "r.yaml line 2: not UTF-8 text"),
    "no updates": (b"max_steps: 0\n", "max_steps must be > 0 (or null: no such limit); got 0"),
    "negative updates": (b"max_steps: -3\n", "max_steps must be > 0 (or null: no such limit); got -3"),
    "no epochs": (b"max_epochs: 0\n", "max_epochs must be > 0"),
    "negative lr": (b"max_steps: 3\nlearning_rate: -1\n", "learning_rate must be > 0; got -1"),
    "beta of 1": (b"max_steps: 3\nadam_beta2: 1.0\n", "adam_beta2 must be in [0, 1); got 1.0"),
    "smoothing of 1": (b"max_steps: 3\nlabel_smoothing: 1\n", "label_smoothing must be in [0, 1)"),
}


@pytest.mark.parametrize("name", sorted(RECIPE_FAULTS))
def test_a_bad_recipe_is_one_line_before_the_run_folder_exists(tmp_path, capsys, name):
    from attention_seq2seq.cli import main

    data, message = RECIPE_FAULTS[name]
    recipe = tmp_path / ("r.json" if "JSON" in name else "r.yaml")
    recipe.write_bytes(data)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:  # the training entry exits 2 itself (also under accelerate launch)
        main(["train", "--recipe", str(recipe), "--output_dir", str(run)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and message in err, err
    assert not run.exists()  # nothing written: the same command runs once the recipe is fixed


def test_the_removed_debug_crash_at_step_is_ignored_when_null_and_refused_otherwise():
    # every earlier run's recipe.yaml records it as null: such a recipe still reproduces the run
    assert config_from_dict(TrainConfig, {"debug_crash_at_step": None, "max_steps": 3}).max_steps == 3
    with pytest.raises(RecipeError, match=r"field 'debug_crash_at_step' was removed: to test --resume, stop the run"):
        config_from_dict(TrainConfig, {"debug_crash_at_step": 4})
