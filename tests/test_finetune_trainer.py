"""Fine-tuning with transformers' Seq2SeqTrainer (training/finetune_trainer.py).

Both families start from a tiny model trained on a corpus slice (tests/helpers.py) and are
fine-tuned for 20 steps on other pairs of the corpus: with the package installed (through the
``attention-seq2seq finetune`` command), and from an export as remote code in a process where the
package cannot be imported.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from helpers import (
    FAMILIES,
    REPO_ROOT,
    build_tiny_run,
    read_pairs,
    run_process_tree,
    tiny_tokenizer,
    trainer_gradients,
    write_jsonl,
)

from attention_seq2seq.cli import main
from attention_seq2seq.training import finetune_trainer as ft
from attention_seq2seq.training.config import FinetuneConfig, finetune_config

STEPS = 20
BASE_IDS = {family: f"someone/tiny-{family.replace('_', '-')}" for family in FAMILIES}


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.getbasetemp() / "cli-tiny-runs"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session")
def finetune_data(runs_root) -> dict[str, Path]:
    """New pairs for fine-tuning (training pairs the base model never saw) and a dev set."""
    folder = runs_root / "finetune-data"
    folder.mkdir(exist_ok=True)
    return {
        "train": write_jsonl(folder / "train.jsonl", read_pairs(160, offset=1000)),
        "validation": write_jsonl(folder / "dev.jsonl", read_pairs(12, split="val")),
        "test": write_jsonl(folder / "test.jsonl", read_pairs(12, split="test")),
    }


def _common_options(data: dict[str, Path]) -> dict:
    return dict(
        train_file=str(data["train"]),
        validation_file=str(data["validation"]),
        test_file=str(data["test"]),
        max_steps=STEPS,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=0,
        label_smoothing=0.0,
        eval_steps=STEPS,
        logging_steps=1,
        save_total_limit=1,
        generation_num_beams=2,
        generation_max_new_tokens=30,
        seed=0,
    )


@pytest.fixture(scope="session")
def finetuned_runs(runs_root, finetune_data) -> dict[str, Path]:
    """Each family fine-tuned through `attention-seq2seq finetune` (the package installed)."""
    out = {}
    for family in FAMILIES:
        base = build_tiny_run(family, runs_root)
        output_dir = runs_root / f"finetuned-{family}"
        if not (output_dir / "metrics.json").exists():
            argv = [
                "finetune",
                "--base-model",
                str(base),
                "--base-model-id",
                BASE_IDS[family],
                "--output-dir",
                str(output_dir),
            ]
            for name, value in _common_options(finetune_data).items():
                argv += ["--" + name.replace("_", "-"), str(value)]
            assert main(argv) == 0
        out[family] = output_dir
    return out


def _losses(metrics: dict) -> list[float]:
    return [entry["loss"] for entry in metrics["train"]["loss_history"]]


def _assert_loss_falls(losses: list[float]) -> None:
    assert len(losses) == STEPS
    assert all(math.isfinite(loss) for loss in losses)
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last < first - 0.05, f"loss did not fall: first steps {losses[:5]}, last steps {losses[-5:]}"


# ------------------------------------------------------------------------------------------------
# compute_metrics: -100 in predictions and labels


def test_compute_metrics_replaces_minus_100_before_decoding(runs_root):
    """A hand-made padded batch: -100 in both arrays is read as padding, text comes back as written."""
    from transformers import EvalPrediction

    tokenizer = tiny_tokenizer(runs_root)
    sentences = ["A dog runs through the snow.", "Two men are talking.", "A girl."]
    encoded = [tokenizer(text_target=s)["input_ids"] for s in sentences]  # pieces + </s>
    width = max(len(ids) for ids in encoded) + 3
    # Generated ids start with the decoder start token; the Trainer pads batches with -100.
    predictions = np.full((len(sentences), width + 1), -100, dtype=np.int64)
    labels = np.full((len(sentences), width), -100, dtype=np.int64)
    for row, ids in enumerate(encoded):
        predictions[row, : len(ids) + 1] = [1, *ids]
        labels[row, : len(ids)] = ids

    with pytest.raises(OverflowError):  # what decoding without the replacement does
        tokenizer.batch_decode(predictions.tolist(), skip_special_tokens=True)
    assert ft.decode_ids(tokenizer, predictions, tokenizer.pad_token_id) == sentences
    assert ft.decode_ids(tokenizer, labels, tokenizer.pad_token_id) == sentences

    compute_metrics = ft.build_compute_metrics(tokenizer)
    perfect = compute_metrics(EvalPrediction(predictions=predictions, label_ids=labels))
    assert perfect["bleu"] == pytest.approx(100.0)
    assert perfect["chrf"] == pytest.approx(100.0)
    assert perfect["gen_len"] == pytest.approx(np.mean([len(ids) - 1 for ids in encoded]))  # no <s>, </s>

    # One wrong sentence: the scores are sacreBLEU's on the decoded strings.
    wrong = predictions.copy()
    wrong[2, : len(encoded[1]) + 1] = [1, *encoded[1]]
    wrong[2, len(encoded[1]) + 1 :] = -100
    scores = compute_metrics(EvalPrediction(predictions=(wrong,), label_ids=labels))
    hypotheses = [sentences[0], sentences[1], sentences[1]]
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [sentences]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [sentences]).score)
    assert scores["bleu"] < 100.0


def test_compute_metrics_uses_the_chinese_bleu_tokenizer_when_asked(runs_root):
    from transformers import EvalPrediction

    tokenizer = tiny_tokenizer(runs_root)
    ids = np.array([tokenizer(text_target="我们走吧。")["input_ids"]])
    reference = np.array([tokenizer(text_target="我们走。")["input_ids"]])
    pred = EvalPrediction(predictions=ids, label_ids=reference)
    zh = ft.build_compute_metrics(tokenizer, bleu_tokenize="zh")(pred)["bleu"]
    plain = ft.build_compute_metrics(tokenizer)(pred)["bleu"]
    assert zh == pytest.approx(sacrebleu.corpus_bleu(["我们走吧。"], [["我们走。"]], tokenize="zh").score)
    assert zh != pytest.approx(plain)  # 13a sees one "word" per sentence; zh splits characters


# ------------------------------------------------------------------------------------------------
# The Trainer's generation settings


@pytest.mark.parametrize("family", FAMILIES)
def test_evaluation_generation_settings_are_explicit(family, runs_root, finetune_data, tmp_path):
    """Evaluation decodes with the configured beam and length, never the 20-token default."""
    config = FinetuneConfig(
        base_model=str(build_tiny_run(family, runs_root)),
        output_dir=str(tmp_path),
        **{**_common_options(finetune_data), "generation_max_new_tokens": 37, "generation_num_beams": 3},
    )
    model, tokenizer = ft.load_model_and_tokenizer(config)
    raw, _ = ft.load_pairs(config)
    tokenized = {split: ft.tokenize_pairs(dataset, tokenizer, config) for split, dataset in raw.items()}
    trainer = ft.build_trainer(config, model, tokenizer, tokenized)
    generation = trainer.model.generation_config
    assert (generation.max_new_tokens, generation.num_beams, generation.do_sample) == (37, 3, False)
    assert trainer.args.predict_with_generate
    # With </s> suppressed only the length limit stops decoding: 37 new tokens after <s>, not 20.
    generation.suppress_tokens = [tokenizer.eos_token_id]
    prediction = trainer.predict(tokenized["validation"])
    longest = (~np.isin(prediction.predictions, [-100, tokenizer.pad_token_id])).sum(axis=1).max()
    assert longest == 37 + 1


def test_evaluation_loss_is_unsmoothed_cross_entropy(runs_root, finetune_data, tmp_path):
    """Training smooths the labels; eval_loss is plain cross-entropy, so exp(eval_loss) is perplexity."""
    import torch

    config = FinetuneConfig(
        base_model=str(build_tiny_run("transformer_seq2seq", runs_root)),
        output_dir=str(tmp_path),
        **{**_common_options(finetune_data), "label_smoothing": 0.3},
    )
    model, tokenizer = ft.load_model_and_tokenizer(config)
    model.config.label_smoothing = config.label_smoothing  # as finetune() does
    raw, _ = ft.load_pairs(config)
    tokenized = {split: ft.tokenize_pairs(dataset, tokenizer, config) for split, dataset in raw.items()}
    trainer = ft.build_trainer(config, model, tokenizer, tokenized)
    eval_loss = trainer.evaluate()["eval_loss"]
    assert model.config.label_smoothing == 0.3  # restored after evaluation

    batch = trainer.data_collator([tokenized["validation"][i] for i in range(len(tokenized["validation"]))])
    with torch.no_grad():
        logits = model.eval()(**batch).logits
    plain = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)
    smoothed = model(**batch).loss
    assert eval_loss == pytest.approx(plain.item(), rel=1e-5)
    assert smoothed.item() > plain.item() + 0.05  # smoothing would have changed the number


# ------------------------------------------------------------------------------------------------
# Fine-tuning with the package installed (through the command line)


@pytest.mark.parametrize("family", FAMILIES)
def test_finetune_loss_falls_and_writes_a_run_folder(family, finetuned_runs, runs_root, finetune_data):
    run = finetuned_runs[family]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["model_family"] == family
    assert metrics["base_model"] == BASE_IDS[family]
    assert metrics["train"]["steps"] == STEPS
    _assert_loss_falls(_losses(metrics))

    # predict_with_generate evaluation at the last step, and a test set with signatures
    (validation,) = metrics["validation"]
    assert validation["step"] == STEPS
    assert 0.0 <= validation["bleu"] <= 100.0 and 0.0 < validation["chrf"] <= 100.0
    assert validation["perplexity"] == pytest.approx(math.exp(validation["loss"]))
    test = metrics["test"]["test"]
    assert test["num_sentences"] == 12 and test["num_beams"] == 2
    assert test["bleu_signature"].startswith("nrefs:1|case:mixed") and "chrf_signature" in test

    # The model folder holds weights, tokenizer and the base model's own generation settings.
    from attention_seq2seq.translation.loading import load_for_inference, translate

    loaded = load_for_inference(run)
    assert loaded.location.kind == "training-run"
    assert loaded.model.config.model_type == family
    assert (loaded.model.generation_config.max_new_tokens, loaded.model.generation_config.num_beams) == (24, 2)
    assert len(translate(loaded, ["Ein Hund läuft."], num_beams=1)) == 1

    # recipe.yaml is the fully resolved config and reads back as the same config
    assert finetune_config(run / "recipe.yaml") == FinetuneConfig(
        base_model=str(build_tiny_run(family, runs_root)),
        base_model_id=BASE_IDS[family],
        output_dir=str(run),
        **_common_options(finetune_data),
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_finetuned_run_exports_with_base_model(family, finetuned_runs, tmp_path):
    from huggingface_hub import ModelCard

    export = tmp_path / "export"
    assert main(["export", str(finetuned_runs[family]), "--output", str(export)]) == 0
    card = ModelCard.load(export / "README.md")
    assert card.data.base_model == BASE_IDS[family]
    assert json.loads((export / "config.json").read_text())["auto_map"]


# ------------------------------------------------------------------------------------------------
# Gradient checkpointing


def test_gradient_checkpointing_gives_the_same_training(runs_root, finetune_data, tmp_path):
    """Transformer: checkpointed training is on and computes the same losses as plain training."""
    import transformers

    base = str(build_tiny_run("transformer_seq2seq", runs_root))
    losses = {}
    for checkpointing in (False, True):
        options = {**_common_options(finetune_data), "max_steps": 3, "validation_file": "", "test_file": ""}
        config = FinetuneConfig(
            base_model=base,
            output_dir=str(tmp_path / str(checkpointing)),
            gradient_checkpointing=checkpointing,
            **options,
        )
        transformers.set_seed(config.seed)
        model, tokenizer = ft.load_model_and_tokenizer(config)
        raw, _ = ft.load_pairs(config)
        tokenized = {split: ft.tokenize_pairs(dataset, tokenizer, config) for split, dataset in raw.items()}
        trainer = ft.build_trainer(config, model, tokenizer, tokenized)
        trainer.train()
        assert trainer.model.is_activation_checkpointing is checkpointing
        losses[checkpointing] = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses[True]) == 3
    # Step 1 checks the forward pass, steps 2-3 that the recomputed gradients were the same.
    assert losses[True] == pytest.approx(losses[False], abs=1e-5)


def test_gradient_checkpointing_on_a_model_without_support_is_refused_by_name(runs_root, finetune_data, tmp_path):
    base = build_tiny_run("rnn_seq2seq", runs_root)
    config = FinetuneConfig(
        base_model=str(base),
        output_dir=str(tmp_path),
        gradient_checkpointing=True,
        **{**_common_options(finetune_data), "max_steps": 2},
    )
    model, _ = ft.load_model_and_tokenizer(config)
    if model.supports_gradient_checkpointing:
        assert ft.finetune(config) == tmp_path
    else:
        with pytest.raises(ValueError, match="gradient_checkpointing: rnn_seq2seq models do not support it"):
            ft.finetune(config)


# ------------------------------------------------------------------------------------------------
# Recipes


RECIPES = sorted((REPO_ROOT / "training" / "recipes").glob("finetune-*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.stem for r in RECIPES])
def test_finetune_recipes_are_valid_and_start_from_a_shipped_training_recipe(recipe, tmp_path, monkeypatch):
    import yaml

    config = finetune_config(recipe)
    config.validate()
    trained = {
        Path(yaml.safe_load(path.read_text()).get("output_dir")): path
        for path in recipe.parent.glob("*.yaml")
        if not path.name.startswith("finetune-")
    }
    assert Path(config.base_model) in trained, (
        f"{recipe.name}: base_model {config.base_model} is no training recipe's output_dir"
    )
    # Written as a path, so a base that was not trained yet is reported as a missing folder.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="base_model: folder not found"):
        ft.resolve_model_path(config.base_model)
    from attention_seq2seq.data import CorpusSpec

    CorpusSpec.coerce(config.corpus)  # a valid spec
    assert config.generation_max_new_tokens > 20 and config.max_train_samples > 0


def test_a_finetune_recipe_is_shipped_for_each_family():
    import yaml

    families = set()
    for recipe in RECIPES:
        base = finetune_config(recipe).base_model
        trained = recipe.parent / f"{Path(base).name}.yaml"
        families.add(yaml.safe_load(trained.read_text())["model_family"])
    assert families == {"rnn", "transformer"}


# ------------------------------------------------------------------------------------------------
# Trainer's own multi-process launch


@pytest.mark.slow
def test_torchrun_two_cpu_processes_form_one_group(runs_root, finetune_data, tmp_path):
    """`torchrun --nproc_per_node 2` on CPU: one gloo group, each rank a disjoint half of the data.

    Four steps of 2 ranks x 8 sentences cover twice the data of one process with the same
    per-device batch; independent copies (the silent failure) would each report the single
    process's epoch count.
    """
    base = build_tiny_run("transformer_seq2seq", runs_root)
    options = [
        "--base-model",
        str(base),
        "--train-file",
        str(finetune_data["train"]),
        "--max-steps",
        "4",
        "--per-device-train-batch-size",
        "8",
        "--logging-steps",
        "1",
        "--save-total-limit",
        "1",
    ]
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = run_process_tree(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            "-m",
            "attention_seq2seq.training.finetune_trainer",
            *options,
            "--output-dir",
            str(tmp_path / "ddp"),
        ],
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("fine-tuned model written") == 1  # rank 0 only
    epochs = json.loads((tmp_path / "ddp" / "metrics.json").read_text())["train"]["epochs"]
    assert epochs == pytest.approx(4 * 2 * 8 / 160)


# ------------------------------------------------------------------------------------------------
# Gradient accumulation under Seq2SeqTrainer (transformers' loss-kwargs contract)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_accumulation_equals_the_full_batch_under_seq2seq_trainer(family, tmp_path):
    """Two examples of 2 and 10 target tokens: two micro-batches of one, accumulated, give the
    gradient of the full batch of two (the mean loss per target token of the whole update), in
    float64 within 1e-6. Without `num_items_in_batch` the Trainer averaged the two micro-batch
    means instead (each example weighted 1/2, not 2/12 and 10/12)."""
    full = trainer_gradients(family, tmp_path, batch_size=2, accumulation=1)
    accumulated = trainer_gradients(family, tmp_path, batch_size=1, accumulation=2)
    assert full.keys() == accumulated.keys() and len(full) > 5
    for name, gradient in full.items():
        assert gradient.dtype.is_floating_point and gradient.dtype.itemsize == 8
        difference = (accumulated[name] - gradient).abs().max().item()
        assert difference < 1e-6, f"{name}: accumulated and full-batch gradients differ by {difference:.3g}"


_DDP_GRADIENTS = r"""
import sys
sys.path.insert(0, sys.argv[1])  # tests/
from pathlib import Path

import torch
import torch.distributed as dist

from helpers import trainer_gradients

family, out = sys.argv[2], Path(sys.argv[3])
gradients = trainer_gradients(family, out.parent / f"rank{dist.get_rank() if dist.is_initialized() else 0}",
                               batch_size=1, accumulation=1)
if not dist.is_initialized() or dist.get_rank() == 0:
    torch.save(gradients, out)
if dist.is_initialized():  # leave the group explicitly: gloo's threads could abort the exit
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_ddp_over_two_cpu_processes_equals_the_full_batch(family, tmp_path):
    """torchrun --nproc_per_node 2, one example per process (2 and 10 target tokens): the update's
    gradient is the full batch's, within 1e-6 in float64 (the model divides by the target tokens
    of both processes, which the Trainer gathers as num_items_in_batch)."""
    import torch

    script = tmp_path / "ddp_gradients.py"
    script.write_text(_DDP_GRADIENTS)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = run_process_tree(
        [
            str(torchrun),
            "--nproc_per_node",
            "2",
            str(script),
            str(REPO_ROOT / "tests"),
            family,
            str(tmp_path / "grads.pt"),
        ],
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ddp = torch.load(tmp_path / "grads.pt")
    full = trainer_gradients(family, tmp_path, batch_size=2, accumulation=1)
    assert ddp.keys() == full.keys()
    for name, gradient in full.items():
        difference = (ddp[name] - gradient).abs().max().item()
        assert difference < 1e-6, f"{name}: DDP and full-batch gradients differ by {difference:.3g}"


def test_finetune_options_take_the_training_commands_spelling_too(capsys):
    from attention_seq2seq.cli import build_parser, dashed

    parser = build_parser()
    written = parser.parse_args(
        ["finetune", "--max-steps", "5", "--output-dir", "o", "--max-train-samples", "7", "--fp16"]
    )
    underscored = parser.parse_args(
        dashed(["finetune", "--max_steps", "5", "--output_dir", "o", "--max_train_samples", "7", "--fp16"])
    )
    assert vars(written) == vars(underscored)
    assert (underscored.max_steps, underscored.output_dir, underscored.max_train_samples) == (5, "o", 7)
    with pytest.raises(SystemExit):
        parser.parse_args(["finetune", "--help"])
    documented = capsys.readouterr().out
    assert "--max-steps" in documented and "--max_steps" not in documented  # one spelling documented
