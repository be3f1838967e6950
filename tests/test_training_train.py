"""Tests of the Accelerate training script: recipes, the update rule, checkpoints, resume, DDP.

The end-to-end runs use tiny models on slices of the real Multi30k corpus (``shared_data``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from attention_seq2seq.training import train as train_module
from attention_seq2seq.training.config import RecipeError, config_from_dict, load_recipe, parse_command_line
from attention_seq2seq.training.train import Collate, TrainConfig, optimizer_update, train, validate_config

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPES = REPO_ROOT / "training" / "recipes"

TINY_TRANSFORMER = {
    "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2,
    "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
}
TINY_RNN = {"embedding_size": 32, "hidden_size": 32, "attention": "luong", "score": "general", "input_feeding": True}


def tiny_config(shared_data: Path, output_dir: Path, **overrides) -> TrainConfig:
    """A run of a few seconds: tiny Transformer, 300 Multi30k pairs, small vocabulary."""
    values = dict(
        model_family="transformer",
        model_config={**TINY_TRANSFORMER, "dropout": 0.1},
        corpus=f"multi30k:{shared_data / 'multi30k'}:de-en",
        max_train_examples=300,
        vocab_size=500,
        max_source_length=48,
        max_target_length=48,
        max_tokens=800,
        learning_rate=3e-3,
        warmup_steps=2,
        max_steps=6,
        eval_every=3,
        save_every=2,
        eval_max_examples=8,
        eval_num_beams=2,
        eval_batch_size=8,
        test_max_examples=8,
        test_num_beams=2,
        num_plot_sentences=1,
        log_every=1,
        log_with="none",
        output_dir=str(output_dir),
    )
    values.update(overrides)
    return config_from_dict(TrainConfig, values)


def weights_of(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=atol, msg=lambda m, k=key: f"{k}: {m}")


# ---------------------------------------------------------------------------------- recipes / CLI
def test_unknown_recipe_field_is_named_with_the_closest_valid_one(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model_family: rnn\nlearnig_rate: 0.001\nmax_steps: 10\n")
    with pytest.raises(RecipeError, match=r"unknown field 'learnig_rate' \(did you mean 'learning_rate'"):
        parse_command_line(TrainConfig, ["--recipe", str(recipe)])
    with pytest.raises(RecipeError, match=r"unknown option --max_step \(did you mean 'max_steps'"):
        parse_command_line(TrainConfig, ["--max_step", "3"])


def test_main_reports_a_bad_recipe_in_one_line_and_exits_2(tmp_path, capsys):
    recipe = tmp_path / "bad.json"
    recipe.write_text(json.dumps({"schedule": "cosine", "max_steps": 3}))
    with pytest.raises(SystemExit) as exit_info:
        train_module.main(["--recipe", str(recipe)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "schedule must be one of 'inverse_sqrt', 'linear', 'constant', 'plateau'; got 'cosine'" in err


def test_command_line_overrides_recipe_and_merges_model_config(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"model_family": "transformer", "model_config": {"d_model": 256, "encoder_layers": 3},
                                      "learning_rate": 1e-3, "max_steps": 100}))
    config = parse_command_line(TrainConfig, [
        "--recipe", str(recipe), "--learning_rate=5e-4", "--model_config.d_model", "128", "--resume",
        "--max_time_minutes", "null", "--eval_max_examples", "null",
    ])
    assert config.learning_rate == 5e-4 and config.max_steps == 100 and config.resume is True
    assert config.model_config == {"d_model": 128, "encoder_layers": 3}  # one key changed, the other kept
    assert config.eval_max_examples is None


def test_wrong_types_and_inconsistent_limits_are_rejected():
    with pytest.raises(RecipeError, match="field 'max_steps' must be int"):
        config_from_dict(TrainConfig, {"max_steps": "ten"})
    with pytest.raises(RecipeError, match="set at least one of max_steps, max_epochs, max_time_minutes"):
        validate_config(TrainConfig())
    with pytest.raises(RecipeError, match="average_best_k .* keep_best_k"):
        validate_config(TrainConfig(max_steps=1, average_best_k=3, keep_best_k=1))
    with pytest.raises(RecipeError, match="model_family must be one of 'rnn', 'transformer'; got 'lstm'"):
        validate_config(TrainConfig(max_steps=1, model_family="lstm"))


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_shipped_recipes_are_valid_and_build_their_model_config(recipe):
    import attention_seq2seq as pkg

    config = config_from_dict(TrainConfig, load_recipe(RECIPES / recipe))
    validate_config(config)
    config_cls = pkg.RNNSeq2SeqConfig if config.model_family == "rnn" else pkg.TransformerSeq2SeqConfig
    config_cls(vocab_size=config.vocab_size, **config.model_config)  # the model config accepts every key


def test_recipe_round_trips_through_recipe_yaml(tmp_path):
    from attention_seq2seq.training.config import dump_recipe

    config = TrainConfig(max_steps=5, model_config={"d_model": 64}, eval_max_examples=None)
    dump_recipe(config, tmp_path / "recipe.yaml")
    assert config_from_dict(TrainConfig, load_recipe(tmp_path / "recipe.yaml")) == config


# ------------------------------------------------------------------------------------ the update
def _random_pairs(n: int, vocab: int, seed: int) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(n):
        s_len, t_len = (int(x) for x in torch.randint(3, 12, (2,), generator=g))
        src = torch.randint(4, vocab, (s_len,), generator=g).tolist() + [2]
        tgt = torch.randint(4, vocab, (t_len,), generator=g).tolist() + [2]
        pairs.append({"input_ids": src, "labels": tgt, "id": i})
    return pairs


def _one_update(family: str, micro_features: list[list[dict]], label_smoothing=0.1, mean_per_micro=False):
    """Weights of a fresh seeded tiny model after one update over ``micro_features``."""
    from accelerate import Accelerator

    import attention_seq2seq as pkg

    torch.manual_seed(0)
    if family == "rnn":
        model = pkg.RNNSeq2SeqForConditionalGeneration(pkg.RNNSeq2SeqConfig(vocab_size=40, dropout=0.0, **TINY_RNN))
    else:
        model = pkg.TransformerSeq2SeqForConditionalGeneration(pkg.TransformerSeq2SeqConfig(vocab_size=40, dropout=0.0, **TINY_TRANSFORMER))
    accelerator = Accelerator(cpu=True)
    # SGD, not Adam: Adam's first step is lr * sign(gradient), which turns rounding noise on
    # gradients that are zero in exact arithmetic (e.g. attention key biases) into +-lr.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model, optimizer = accelerator.prepare(model, optimizer)
    collate = Collate(pad_token_id=0, decoder_start_token_id=1)
    micro = [{k: v for k, v in collate(f).items() if k != "id"} for f in micro_features]
    if mean_per_micro:  # what averaging per-micro-batch means would do: the bug this design avoids
        for mb in micro:
            logits = model(**{k: mb[k] for k in ("input_ids", "attention_mask", "decoder_input_ids")}).logits
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), mb["labels"].flatten(), label_smoothing=label_smoothing)
            (loss / len(micro)).backward()
        optimizer.step()
    else:
        optimizer_update(accelerator, model, optimizer, scheduler, micro, label_smoothing, max_grad_norm=1.0)
    return {k: v.detach().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_two_accumulated_micro_batches_equal_one_batch_of_both(family):
    # Micro-batches with different target-token counts: only a loss normalised by the tokens of
    # the whole update makes 2 x B accumulated equal to one batch of 2B.
    pairs = _random_pairs(6, vocab=40, seed=1)
    whole = _one_update(family, [pairs])
    accumulated = _one_update(family, [pairs[:2], pairs[2:]])
    assert_same_weights(whole, accumulated, atol=1e-6)
    # Negative control: the per-micro-batch mean (HF's default loss) moves the weights elsewhere.
    naive = _one_update(family, [pairs[:2], pairs[2:]], mean_per_micro=True)
    assert max((naive[k] - whole[k]).abs().max().item() for k in whole) > 1e-4


def test_collate_shifts_labels_behind_the_start_token():
    batch = Collate(pad_token_id=0, decoder_start_token_id=1)(
        [{"input_ids": [5, 6, 2], "labels": [7, 8, 9, 2], "id": 4}, {"input_ids": [5, 2], "labels": [7, 2], "id": 9}]
    )
    # shift_tokens_right: the short row's </s> becomes an input at a padded (ignored) position.
    assert batch["decoder_input_ids"].tolist() == [[1, 7, 8, 9], [1, 7, 2, 0]]
    assert batch["labels"].tolist() == [[7, 8, 9, 2], [7, 2, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["id"].tolist() == [4, 9]
