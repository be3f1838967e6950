"""The `attention-seq2seq` command line, run in-process through ``main([...])`` on tiny models
trained on a Multi30k slice (tests/helpers.py), plus two runs of the installed console script."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from safetensors.torch import load_file

from helpers import CHECKPOINT_STEPS, FAMILIES, build_tiny_run, pairs_corpus_spec, pairs_languages, read_pairs

from attention_seq2seq.cli import build_parser, main
from attention_seq2seq.translation.scores import corpus_scores

SENTENCES = ["Ein Hund läuft durch den Schnee.", "Zwei Männer spielen Fußball.", "Eine Frau."]
COMMANDS = [
    "train",
    "finetune",
    "translate",
    "evaluate",
    "plot-attention",
    "demo",
    "alignment-error-rate",
    "average-checkpoints",
    "export",
    "push",
]


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.getbasetemp() / "cli-tiny-runs"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session", params=FAMILIES)
def run(request, runs_root) -> Path:
    return build_tiny_run(request.param, runs_root)


def _reference_translations(run: Path, sentences: list[str], **generate_kwargs) -> list[str]:
    """One sentence at a time, no batching, straight through transformers."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    model = AutoModelForSeq2SeqLM.from_pretrained(run / "model").eval()
    out = []
    with torch.inference_mode():
        for sentence in sentences:
            ids = model.generate(**tokenizer([sentence], return_tensors="pt"), **generate_kwargs)
            out.append(tokenizer.decode(ids[0], skip_special_tokens=True).strip())
    return out


def _one_line_error(capsys, argv: list[str]) -> str:
    """Run ``main(argv)``, expecting exit status 2 and exactly one line on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        code = main(argv)
        raise SystemExit(code)
    assert exit_info.value.code == 2
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


# ------------------------------------------------------------------------------------------------
# --help and argument errors


def test_every_command_is_listed_in_the_parser():
    subparsers = build_parser()._subparsers._group_actions[0].choices
    assert sorted(subparsers) == sorted(COMMANDS)


_IMPORTS_AFTER = r"""
import json, sys
from attention_seq2seq.cli import main
for argv in (["--help"], ["--version"], ["translate", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
heavy = sorted(name for name in ("torch", "transformers", "datasets", "evaluate", "numpy") if name in sys.modules)
print(json.dumps(heavy))
"""

_REGISTERED_AFTER = r"""
import json, sys
exec(sys.argv[1])  # the first import of the session
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from attention_seq2seq.modeling import saving
print(json.dumps(["rnn_seq2seq" in CONFIG_MAPPING, "transformer_seq2seq" in CONFIG_MAPPING,
                  saving.REMOTE_CODE_WRITER is not None]))
"""


def _run_python(code: str, *args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout.strip().splitlines()[-1]


def test_help_and_version_import_neither_torch_nor_transformers():
    """`attention-seq2seq --help` imported torch, transformers and both models first (6-11 s)."""
    assert json.loads(_run_python(_IMPORTS_AFTER)) == []


@pytest.mark.parametrize(
    "first_import",
    [
        "import attention_seq2seq",
        "import transformers; import attention_seq2seq",
        "from attention_seq2seq.modeling.modeling_transformer_seq2seq import TransformerSeq2SeqModel",
        "import attention_seq2seq.configuration.configuration_rnn_seq2seq",
        "from attention_seq2seq import RNNSeq2SeqConfig",
    ],
)
def test_the_auto_classes_are_registered_whatever_is_imported_first(first_import):
    """The package imports lazily but still registers both families (and the remote-code writer)
    once transformers is loaded."""
    assert json.loads(_run_python(_REGISTERED_AFTER, first_import)) == [True, True, True]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_each_command_has_examples(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert f"usage: attention-seq2seq {command}" in text
    assert "examples:" in text
    assert f"attention-seq2seq {command} " in text.split("examples:", 1)[1]


def test_main_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for command in COMMANDS:
        assert f"\n  {command} " in text


BAD_ARGUMENTS = [
    (["translate", "-m", "m", "--num-beams", "0", "x"], ["--num-beams", "positive integer"]),
    (["translate", "-m", "m", "--top-p", "1.5", "--do-sample", "x"], ["--top-p", "(0.0, 1.0]"]),
    (["translate", "-m", "m", "--temperature", "hot", "--do-sample"], ["--temperature", "number"]),
    (["translate", "-m", "m", "--greedy", "--do-sample", "x"], ["--greedy", "--do-sample"]),
    (["translate", "-m", "m", "--greedy", "--num-beams", "4", "x"], ["--greedy", "--num-beams 4"]),
    (["translate", "-m", "m", "--top-k", "5", "x"], ["--top-k", "--do-sample"]),
    (["translate", "-m", "m", "--greedy", "--length-penalty", "2", "x"], ["--length-penalty", "beam search"]),
    (["translate", "-m", "m", "--length-penalty", "long", "x"], ["--length-penalty", "number"]),
    (["translate", "-m", "m", "--input", "in.txt", "x"], ["--input", "arguments"]),
    (["evaluate", "-m", "m", "--split", "dev"], ["--split", "'train', 'validation', 'test'"]),
    (["evaluate", "-m", "m"], ["--corpus", "--src", "--ref"]),
    (["evaluate", "-m", "m", "--corpus", "multi30k:x", "--src", "a"], ["--corpus", "--src"]),
    (["evaluate", "-m", "m", "--src", "a", "--ref", "b", "--bootstrap", "1"], ["--bootstrap", "at least 2"]),
    (["plot-attention", "-m", "m", "--source", "x", "--output", "a.jpg"], ["--output", ".png"]),
    (["plot-attention", "-m", "m", "--output", "a.png"], ["--source", "required"]),
    (["average-checkpoints", "--output", "o"], ["--run", "checkpoint"]),
    (["average-checkpoints", "a", "--output", "o"], ["at least two"]),
    (["average-checkpoints", "--run", "r", "--last", "-1", "--output", "o"], ["--last", "positive integer"]),
    (["finetune", "--base-model", "b", "--output-dir", "o"], ["corpus", "train_file"]),
    (
        ["finetune", "--base-model", "b", "--output-dir", "o", "--train-file", "t", "--max-steps", "0"],
        ["max_steps", ">= 1"],
    ),
    (["finetune", "--max-steps", "many"], ["--max-steps", "int"]),
    (
        ["finetune", "--base-model", "./no/such/run", "--output-dir", "o", "--train-file", "t"],
        ["base_model: folder not found: ./no/such/run"],
    ),
    (["frobnicate"], ["invalid choice", "translate", "evaluate"]),
]


@pytest.mark.parametrize("argv,expected", BAD_ARGUMENTS, ids=[" ".join(a[:3]) for a, _ in BAD_ARGUMENTS])
def test_bad_arguments_give_one_line_naming_the_option(argv, expected, capsys):
    line = _one_line_error(capsys, argv)
    assert line.startswith("attention-seq2seq")
    for fragment in expected:
        assert fragment in line, line


def test_unknown_recipe_field_is_named_with_the_valid_ones(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("base_model: b\noutput_dir: o\ntrain_file: t\nlearning_rat: 0.1\n")
    line = _one_line_error(capsys, ["finetune", "--recipe", str(recipe)])
    assert "learning_rat" in line and "learning_rate" in line


@pytest.mark.parametrize(
    "recipe, expected",
    [
        ("multi30k-transformer-small.yaml", "dropout must be float; got 'high'"),
        ("bible-rnn-bahdanau.yaml", "dropout must be float or int; got 'high'"),
    ],
)
def test_a_model_config_value_of_the_wrong_type_is_named_with_its_type(recipe, expected, tmp_path, capsys):
    """Before: "'<=' not supported between instances of 'float' and 'str'" (RNN), or accepted (Transformer)."""
    recipe_path = Path(__file__).resolve().parents[1] / "training" / "recipes" / recipe
    line = _one_line_error(
        capsys,
        [
            "train",
            "--recipe",
            str(recipe_path),
            "--model_config.dropout",
            "high",
            "--output_dir",
            str(tmp_path / "run"),
        ],
    )
    assert f"model_config: {expected}" in line
    assert not (tmp_path / "run").exists()


def test_a_missing_recipe_is_one_line_naming_the_file_from_the_training_module_too(tmp_path, capsys):
    """`python -m attention_seq2seq.training.train --recipe missing.yaml` (what `accelerate launch`
    runs in each process) printed a FileNotFoundError traceback; now one line, exit status 2."""
    from attention_seq2seq.training.train import main as train_main

    missing = tmp_path / "missing.yaml"
    with pytest.raises(SystemExit) as exit_info:
        train_main(["--recipe", str(missing)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == f"error: recipe not found: {missing}" and "Traceback" not in err
    assert f"recipe not found: {missing}" in _one_line_error(capsys, ["train", "--recipe", str(missing)])


def test_user_errors_exit_2_with_one_line(tmp_path, capsys):
    missing = tmp_path / "no-such-run"
    assert "model folder not found" in _one_line_error(capsys, ["translate", "-m", str(missing), "Hallo"])
    assert "holds no model" in _one_line_error(capsys, ["translate", "-m", str(tmp_path), "Hallo"])
    assert "--src: file not found" in _one_line_error(
        capsys, ["evaluate", "-m", str(tmp_path), "--src", str(missing), "--ref", str(missing)]
    )
    assert "folder not found" in _one_line_error(capsys, ["export", str(missing), "--output", str(tmp_path / "e")])
    (tmp_path / "run").mkdir()
    assert "no checkpoints/step_<N>" in _one_line_error(
        capsys, ["average-checkpoints", "--run", str(tmp_path / "run"), "--output", str(tmp_path / "avg")]
    )
    assert "unknown corpus kind" in _one_line_error(
        capsys, ["evaluate", "-m", str(tmp_path), "--corpus", "nosuchkind:x"]
    )


def test_train_passes_the_recipe_and_overrides_to_the_training_script(monkeypatch, tmp_path):
    from attention_seq2seq.training import train as train_module

    received = []
    monkeypatch.setattr(train_module, "train", lambda config: received.append(config) or tmp_path)
    recipe = train_module.__file__.replace("train.py", "recipes/multi30k-transformer-small.yaml")
    argv = ["train", "--recipe", recipe, "--output_dir", str(tmp_path / "run"), "--model_config.d_model", "64"]
    assert main(argv) == 0
    (config,) = received
    assert config.output_dir == str(tmp_path / "run")
    assert config.model_config["d_model"] == 64 and config.model_config["encoder_layers"] == 3  # merged
    assert config.corpus.startswith("multi30k:")


def test_train_bad_option_exits_2_naming_it(capsys):
    assert "--bogus" in _one_line_error(capsys, ["train", "--bogus", "3"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_or_unknown_device_is_named(run, capsys):
    assert "--device cuda: CUDA is not available" in _one_line_error(
        capsys, ["translate", "-m", str(run), "Hallo", "--device", "cuda"]
    )
    assert "--device: unknown device 'gpu'" in _one_line_error(
        capsys, ["translate", "-m", str(run), "Hallo", "--device", "gpu"]
    )


def test_push_offline_fails_in_one_line(run, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    export = tmp_path / "export"
    assert main(["export", str(run), "--output", str(export)]) == 0
    capsys.readouterr()
    assert main(["push", str(export), "me/tiny", "--dry-run"]) == 0
    listing = capsys.readouterr().out
    assert "model.safetensors" in listing and "config.json" in listing
    line = _one_line_error(capsys, ["push", str(export), "me/tiny"])
    assert "offline" in line


# ------------------------------------------------------------------------------------------------
# Where a model lives


def test_locate_model_tells_the_four_forms_apart(runs_root, tmp_path):
    from attention_seq2seq.common.errors import UserError
    from attention_seq2seq.hub.export import export_model
    from attention_seq2seq.translation.loading import locate_model

    run = build_tiny_run("transformer_seq2seq", runs_root)
    export = export_model(run, tmp_path / "export")
    assert (locate_model(run).kind, locate_model(run).model_path, locate_model(run).run_dir) == (
        "training-run",
        str(run / "model"),
        run,
    )
    assert locate_model(run / "model").kind == "model-folder"
    assert locate_model(export).kind == "export"
    assert (locate_model("someone/model").kind, locate_model("someone/model").model_path) == ("hub", "someone/model")
    for bad in (tmp_path / "missing", "./relative/missing", "a/b/c", tmp_path):
        with pytest.raises(UserError):
            locate_model(bad)


def test_a_missing_folder_under_an_existing_one_is_not_taken_for_a_hub_id(tmp_path, monkeypatch, capsys, no_network):
    """-m runs/nope where ./runs exists: "model folder not found" at once; before, it was looked
    up on the Hub (54 s of retries with a network). owner/name without such a folder stays a Hub id."""
    from attention_seq2seq.common.errors import UserError
    from attention_seq2seq.translation.loading import locate_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(UserError, match="model folder not found: runs/nope"):
        locate_model("runs/nope")
    assert locate_model("someone/model").kind == "hub"
    line = _one_line_error(capsys, ["translate", "-m", "runs/nope", "Hallo"])
    assert "model folder not found: runs/nope" in line


# ------------------------------------------------------------------------------------------------
# translate


def test_translate_arguments_stdin_and_file_agree_with_unbatched_generate(run, tmp_path, capsys, monkeypatch):
    expected = _reference_translations(run, SENTENCES, num_beams=1, do_sample=False, max_new_tokens=16)
    options = ["--greedy", "--max-new-tokens", "16", "--batch-size", "2"]

    assert main(["translate", "-m", str(run), *SENTENCES, *options]) == 0
    assert capsys.readouterr().out.splitlines() == expected

    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(s + "\n" for s in SENTENCES)))
    assert main(["translate", "-m", str(run), *options]) == 0
    assert capsys.readouterr().out.splitlines() == expected

    # A file with an empty line: the output stays line-aligned with the input.
    source, target = tmp_path / "in.de", tmp_path / "out.en"
    source.write_text(f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n{SENTENCES[2]}\n", encoding="utf-8")
    assert main(["translate", "-m", str(run / "model"), "--input", str(source), "--output", str(target), *options]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert target.read_text(encoding="utf-8").splitlines() == [expected[0], "", *expected[1:]]
    assert "4/4" in captured.err  # the progress bar (input lines, the empty one too), on stderr


def test_translate_from_an_export_folder_with_installed_or_shipped_code(runs_root, tmp_path, capsys, monkeypatch):
    run = build_tiny_run("rnn_seq2seq", runs_root)
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    export = tmp_path / "export"
    assert main(["export", str(run), "--output", str(export)]) == 0
    capsys.readouterr()
    expected = _reference_translations(run, SENTENCES, num_beams=2, max_new_tokens=16)
    for extra in ([], ["--trust-remote-code"]):
        assert (
            main(["translate", "-m", str(export), *SENTENCES, "--num-beams", "2", "--max-new-tokens", "16", *extra])
            == 0
        )
        assert capsys.readouterr().out.splitlines() == expected


def test_translate_from_a_hub_id_offline_fails_in_one_line(capsys, monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at import
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))  # empty
    line = _one_line_error(capsys, ["translate", "-m", "someone/no-such-model", "Hallo"])
    assert line.startswith("attention-seq2seq translate: error: cannot load model someone/no-such-model")


def test_translate_decoding_options_reach_generate(runs_root, capsys):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    assert main(["translate", "-m", str(run), SENTENCES[0], "--num-beams", "3", "--max-new-tokens", "12"]) == 0
    beam = capsys.readouterr().out.splitlines()
    assert beam == _reference_translations(run, SENTENCES[:1], num_beams=3, max_new_tokens=12)

    # the length penalty reaches generate (evaluate's JSON records it, see the evaluate test)
    argv = [
        "translate",
        "-m",
        str(run),
        *SENTENCES,
        "--num-beams",
        "4",
        "--max-new-tokens",
        "12",
        "--length-penalty",
        "3",
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.splitlines() == _reference_translations(
        run, SENTENCES, num_beams=4, max_new_tokens=12, length_penalty=3.0
    )

    assert main(["translate", "-m", str(run), SENTENCES[0], "--greedy", "--max-new-tokens", "3"]) == 0
    from transformers import AutoTokenizer

    short = capsys.readouterr().out.strip()
    assert len(AutoTokenizer.from_pretrained(run / "model")(text_target=short)["input_ids"]) <= 3 + 1

    sampled = []
    for _ in range(2):
        argv = [
            "translate",
            "-m",
            str(run),
            *SENTENCES,
            "--do-sample",
            "--top-k",
            "20",
            "--top-p",
            "0.9",
            "--temperature",
            "1.5",
            "--seed",
            "7",
            "--max-new-tokens",
            "12",
        ]
        assert main(argv) == 0
        sampled.append(capsys.readouterr().out)
    assert sampled[0] == sampled[1]  # --seed makes sampling repeatable
    greedy = _reference_translations(run, SENTENCES, num_beams=1, do_sample=False, max_new_tokens=12)
    assert sampled[0].splitlines() != greedy  # and it does sample


# ------------------------------------------------------------------------------------------------
# evaluate


def _evaluate_val_files(run, tmp_path, *options: str):
    """Runs ``evaluate --src --ref`` on the first 12 validation pairs: (pairs, JSON path, hypotheses path)."""
    pairs = read_pairs(12, split="val")
    src, ref = tmp_path / "val.de", tmp_path / "val.en"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    output, hypotheses = tmp_path / "scores.json", tmp_path / "val.hyp"
    argv = [
        "evaluate",
        "-m",
        str(run),
        "--src",
        str(src),
        "--ref",
        str(ref),
        "--output",
        str(output),
        "--hypotheses",
        str(hypotheses),
        "--no-progress",
        *options,
    ]
    assert main(argv) == 0
    return pairs, output, hypotheses


def test_evaluate_two_files_writes_json_and_prints_a_table(run, tmp_path, capsys):
    pairs, output, hypotheses = _evaluate_val_files(run, tmp_path, "--num-beams", "2", "--length-penalty", "0.5")
    table = capsys.readouterr().out

    result = json.loads(output.read_text())["val"]
    hyps = hypotheses.read_text(encoding="utf-8").splitlines()
    refs = [t for _, t in pairs]
    assert len(hyps) == 12 and result["num_sentences"] == 12 and result["num_beams"] == 2
    assert result["length_penalty"] == 0.5
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert result["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0")
    header, rule, row, *signatures = table.splitlines()
    assert header.split() == ["test", "set", "sentences", "beams", "BLEU", "chrF", "TER"]
    assert row.split() == ["val", "12", "2", f"{result['bleu']:.2f}", f"{result['chrf']:.2f}", f"{result['ter']:.2f}"]
    assert signatures == [
        f"BLEU signature: {result['bleu_signature']}",
        f"chrF signature: {result['chrf_signature']}",
        f"TER signature: {result['ter_signature']} (lower is better)",
    ]


def test_evaluate_without_output_writes_into_the_run_folder_never_the_current_one(
    runs_root, tmp_path, monkeypatch, capsys
):
    """Before: eval_<name>.json landed in the current folder (a checkout: inside the repository)."""
    run = tmp_path / "run"
    shutil.copytree(build_tiny_run("rnn_seq2seq", runs_root), run)
    pairs = read_pairs(4, split="val")
    src, ref = tmp_path / "val.de", tmp_path / "val.en"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for model in (run, run / "model"):  # a training run, then a plain model folder
        assert (
            main(["evaluate", "-m", str(model), "--src", str(src), "--ref", str(ref), "--greedy", "--no-progress"]) == 0
        )
    assert list(cwd.iterdir()) == [] and not list((run / "model").glob("eval_*"))
    assert json.loads((run / "eval_val.json").read_text())["val"]["num_sentences"] == 4
    assert "no JSON written" in capsys.readouterr().err


def test_evaluate_bootstrap_interval_reaches_the_json_and_the_table(run, tmp_path, capsys):
    pairs, output, hypotheses = _evaluate_val_files(run, tmp_path, "--greedy", "--bootstrap", "200")
    row = capsys.readouterr().out.splitlines()[2]

    result = json.loads(output.read_text())["val"]
    hyps, refs = hypotheses.read_text(encoding="utf-8").splitlines(), [t for _, t in pairs]
    expected = corpus_scores(hyps, refs, "en", n_bootstrap=200)
    for key in ("bleu", "bleu_ci95", "chrf", "chrf_ci95", "bleu_signature"):
        assert result[key] == expected[key], key
    assert "|bs:200|" in result["bleu_signature"]
    assert row.split()[3:] == [
        f"{result['bleu']:.2f}",
        "±",
        f"{result['bleu_ci95']:.2f}",
        f"{result['chrf']:.2f}",
        "±",
        f"{result['chrf_ci95']:.2f}",
        f"{result['ter']:.2f}",
        "±",
        f"{result['ter_ci95']:.2f}",
    ]


def test_evaluate_a_corpus_split_and_update_the_run_metrics(runs_root, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(build_tiny_run("rnn_seq2seq", runs_root), run)
    spec = pairs_corpus_spec()
    argv = [
        "evaluate",
        "-m",
        str(run),
        "--corpus",
        spec,
        "--split",
        "validation",
        "--limit",
        "8",
        "--output",
        str(tmp_path / "e.json"),
        "--update-metrics",
        "--greedy",
        "--no-progress",
    ]
    assert main(argv) == 0
    name, result = next(iter(json.loads((tmp_path / "e.json").read_text()).items()))
    assert name.endswith("-validation") and " " not in name
    assert result["split"] == "validation" and result["num_sentences"] == 8
    recorded = json.loads((run / "metrics.json").read_text())["test"][name]
    assert recorded["bleu"] == result["bleu"] and recorded["chrf_signature"] == result["chrf_signature"]
    assert name in capsys.readouterr().out


def test_evaluate_picks_the_chinese_bleu_tokenizer_from_the_target_language(runs_root, tmp_path, capsys):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    src, ref = tmp_path / "t.en", tmp_path / "t.zh"
    src.write_text("Hi.\nRun.\n", encoding="utf-8")
    ref.write_text("你好。\n你用跑的。\n", encoding="utf-8")
    assert (
        main(
            [
                "evaluate",
                "-m",
                str(run),
                "--src",
                str(src),
                "--ref",
                str(ref),
                "-o",
                str(tmp_path / "zh.json"),
                "--greedy",
                "--max-new-tokens",
                "4",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "|tok:zh|" in json.loads((tmp_path / "zh.json").read_text())["t"]["bleu_signature"]


# ------------------------------------------------------------------------------------------------
# plot-attention


def _read_png(path: Path) -> np.ndarray:
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 50 and image.shape[1] > 50
    return image


def test_plot_attention_of_a_translation_and_of_a_reference(run, tmp_path, capsys):
    family = json.loads((run / "model" / "config.json").read_text())["model_type"]
    own = tmp_path / "own.png"
    assert main(["plot-attention", "-m", str(run), "--source", SENTENCES[0], "--output", str(own)]) == 0
    written = capsys.readouterr().out.split()
    assert written[0] == str(own)
    _read_png(own)
    if family == "transformer_seq2seq":  # and one file of every head per layer
        assert written[1:] == [str(tmp_path / "own_layer1_heads.png")]
        _read_png(tmp_path / "own_layer1_heads.png")
    else:
        assert written[1:] == []

    forced = tmp_path / "forced.png"
    argv = [
        "plot-attention",
        "-m",
        str(run),
        "--source",
        SENTENCES[0],
        "--reference",
        "A dog runs in the snow.",
        "--output",
        str(forced),
        "--no-per-head",
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.split() == [str(forced)]
    _read_png(forced)


def test_attention_rows_are_distributions_over_the_source(run):
    from attention_seq2seq.attention.forced import sentence_attention
    from attention_seq2seq.translation.loading import load_for_inference

    loaded = load_for_inference(run, attn_implementation="eager")
    reference = "A dog runs in the snow."
    layers, src_tokens, tgt_tokens = sentence_attention(loaded, SENTENCES[0], reference, {})
    assert src_tokens[-1] == tgt_tokens[-1] == "</s>"
    assert loaded.tokenizer.convert_tokens_to_string(tgt_tokens[:-1]).strip() == reference
    for weights in layers:
        assert weights.shape[1:] == (len(tgt_tokens), len(src_tokens))
        np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# average-checkpoints


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_averaging_two_identical_checkpoints_gives_the_same_weights(run, tmp_path, capsys):
    checkpoint = run / "checkpoints" / f"step_{CHECKPOINT_STEPS[0]}"
    out = tmp_path / "avg"
    argv = [
        "average-checkpoints",
        str(checkpoint),
        str(checkpoint),
        "--config-from",
        str(run / "model"),
        "--output",
        str(out),
    ]
    assert main(argv) == 0
    averaged, original = _weights(out), _weights(checkpoint)
    for name, tensor in original.items():
        assert torch.equal(averaged[name], tensor), name


def test_averaging_two_checkpoints_of_a_run_gives_their_mean_and_a_working_model(run, tmp_path, capsys):
    out = tmp_path / "avg"
    assert main(["average-checkpoints", "--run", str(run), "--last", "2", "--output", str(out)]) == 0
    first, second = (_weights(run / "checkpoints" / f"step_{step}") for step in CHECKPOINT_STEPS)
    averaged = _weights(out)
    assert not all(torch.equal(first[n], second[n]) for n in first)  # the two really differ
    for name in first:
        torch.testing.assert_close(averaged[name], (first[name] + second[name]) / 2, rtol=0, atol=1e-7)
    capsys.readouterr()
    # The result is a complete model folder (config, generation config, tokenizer): it translates,
    # as transformers does with the same folder.
    sentence = read_pairs(1)[0][0]
    assert main(["translate", "-m", str(out), sentence, "--greedy"]) == 0
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(out), AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    with torch.inference_mode():
        ids = model.generate(**tokenizer([sentence], return_tensors="pt"), num_beams=1, do_sample=False)
    assert capsys.readouterr().out == tokenizer.decode(ids[0], skip_special_tokens=True).strip() + "\n"


# ------------------------------------------------------------------------------------------------
# The installed console script, as a user runs it


def _console_script() -> str:
    script = Path(sys.executable).with_name("attention-seq2seq")
    if not script.exists():
        pytest.skip("console script not installed (pip install -e .)")
    return str(script)


def test_console_script_translates_from_stdin(runs_root):
    run = build_tiny_run("transformer_seq2seq", runs_root)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [_console_script(), "translate", "-m", str(run), "--greedy", "--max-new-tokens", "16"],
        input="".join(s + "\n" for s in SENTENCES),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    expected = _reference_translations(run, SENTENCES, num_beams=1, do_sample=False, max_new_tokens=16)
    assert result.stdout.splitlines() == expected


def test_console_script_bad_argument_exits_2_without_traceback():
    result = subprocess.run(
        [_console_script(), "translate", "-m", "m", "--num-beams", "zero", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "attention-seq2seq translate: error: argument --num-beams: must be a positive integer; got 'zero'"
    ]


# ------------------------------------------------------------------------------------------------
# A run written by the real training script (accelerator.save_state checkpoints, averaged model)


@pytest.mark.slow
def test_commands_on_a_run_of_the_training_script(tmp_path, capsys):
    run = tmp_path / "run"
    argv = [
        "train",
        "--recipe",
        str(Path(__file__).parents[1] / "training/recipes/multi30k-transformer-small.yaml"),
        "--corpus",
        pairs_corpus_spec(),
        "--max_train_examples",
        "300",
        "--vocab_size",
        "400",
        "--model_config.d_model",
        "32",
        "--model_config.encoder_layers",
        "1",
        "--model_config.decoder_layers",
        "1",
        "--model_config.encoder_attention_heads",
        "2",
        "--model_config.decoder_attention_heads",
        "2",
        "--model_config.encoder_ffn_dim",
        "64",
        "--model_config.decoder_ffn_dim",
        "64",
        "--max_steps",
        "20",
        "--eval_every",
        "10",
        "--save_every",
        "10",
        "--eval_max_examples",
        "4",
        "--test_max_examples",
        "4",
        "--max_tokens",
        "800",
        "--warmup_steps",
        "5",
        "--keep_last_checkpoints",
        "2",
        "--average_last_k",
        "0",
        "--eval_num_beams",
        "1",
        "--test_num_beams",
        "1",
        "--log_with",
        "none",
        "--output_dir",
        str(run),
    ]
    assert main(argv) == 0
    capsys.readouterr()

    assert main(["translate", "-m", str(run), *SENTENCES, "--greedy", "--max-new-tokens", "8"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(SENTENCES)

    averaged = tmp_path / "averaged"
    assert main(["average-checkpoints", "--run", str(run), "--last", "2", "--output", str(averaged)]) == 0
    first, second = (_weights(run / "checkpoints" / f"step_{step}") for step in (10, 20))
    for name, tensor in _weights(averaged).items():
        torch.testing.assert_close(tensor, (first[name] + second[name]) / 2, rtol=0, atol=1e-7)

    png = tmp_path / "attention.png"
    assert main(["plot-attention", "-m", str(run), "--source", SENTENCES[0], "--output", str(png)]) == 0
    _read_png(png)

    assert (
        main(
            [
                "evaluate",
                "-m",
                str(run),
                "--corpus",
                pairs_corpus_spec(),
                "--limit",
                "4",
                "--greedy",
                "--no-progress",
                "--output",
                str(tmp_path / "eval.json"),
            ]
        )
        == 0
    )
    assert "BLEU signature: nrefs:1" in capsys.readouterr().out

    # Fine-tune it on a corpus spec, then export: the card names the base model.
    finetuned, export = tmp_path / "finetuned", tmp_path / "export"
    assert (
        main(
            [
                "finetune",
                "--base-model",
                str(run),
                "--base-model-id",
                "someone/base",
                "--corpus",
                pairs_corpus_spec(),
                "--max-train-samples",
                "64",
                "--max-eval-samples",
                "4",
                "--max-test-samples",
                "4",
                "--max-steps",
                "4",
                "--eval-steps",
                "4",
                "--per-device-train-batch-size",
                "16",
                "--generation-max-new-tokens",
                "8",
                "--output-dir",
                str(finetuned),
            ]
        )
        == 0
    )
    metrics = json.loads((finetuned / "metrics.json").read_text())
    assert (metrics["corpus"]["source_lang"], metrics["corpus"]["target_lang"]) == pairs_languages()
    assert metrics["train"]["train_samples"] == 64
    assert list(metrics["test"]) == [f"{metrics['corpus']['name']}-test".replace(" ", "-")]
    assert next(iter(metrics["test"].values()))["num_sentences"] == 4
    assert main(["export", str(finetuned), "--output", str(export)]) == 0
    from huggingface_hub import ModelCard

    assert ModelCard.load(export / "README.md").data.base_model == "someone/base"


def test_every_command_takes_both_spellings_of_an_option():
    from attention_seq2seq.cli import dashed

    words = ["translate", "-m", "run_1", "--num_beams", "3", "--max_new_tokens=7", "--batch-size", "4", "a_b --x"]
    assert dashed(words) == [
        "translate",
        "-m",
        "run_1",
        "--num-beams",
        "3",
        "--max-new-tokens=7",
        "--batch-size",
        "4",
        "a_b --x",
    ]
    args, unknown = build_parser().parse_known_args(dashed(words))
    assert (args.num_beams, args.max_new_tokens, args.batch_size, args.model, unknown) == (3, 7, 4, ["run_1"], [])
    args, _ = build_parser().parse_known_args(dashed(["evaluate", "-m", "m", "--target_lang", "zh", "--no_progress"]))
    assert (args.target_lang, args.no_progress) == ("zh", True)
    args, _ = build_parser().parse_known_args(dashed(["evaluate", "-m", "m", "--max_test_samples", "9"]))
    assert args.limit == 9  # the trainers' name of the same limit
