"""Tests of the Accelerate training script: recipes, the update rule, checkpoints, resume, DDP.

The end-to-end runs use tiny models on slices of a real corpus (``pairs_corpus``: Multi30k from
../shared/data when present, else the committed Bible pairs; helpers.pairs_corpus_spec).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import tokenizers
import torch
import yaml
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from helpers import TINY_TRANSFORMER, free_port, pairs_corpus_spec, pairs_languages, run_process_tree

from attention_seq2seq.training import build as build_module
from attention_seq2seq.training import objectives
from attention_seq2seq.training import train as train_module
from attention_seq2seq.training.checkpoints import STATE_FILE
from attention_seq2seq.training.config import RecipeError, config_from_dict, load_recipe, parse_command_line
from attention_seq2seq.training.train import (
    Collate,
    TrainConfig,
    optimizer_param_groups,
    optimizer_update,
    train,
    validate_config,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
RECIPES = REPO_ROOT / "training" / "recipes"

TINY_RNN = {"embedding_size": 32, "hidden_size": 32, "attention": "luong", "score": "general", "input_feeding": True}


@pytest.fixture(scope="session")
def pairs_corpus() -> str:
    """The corpus spec of the tiny runs: Multi30k de-en when ../shared/data is there, else the
    committed Bible es-en pairs."""
    return pairs_corpus_spec()


def _test_key(corpus: str) -> str:
    """metrics.json's test entry of a run on ``corpus``: ``<corpus kind>-test``."""
    return f"{corpus.split(':')[0]}-test"


def tiny_config(corpus: str, output_dir: Path, **overrides) -> TrainConfig:
    """A run of a few seconds: tiny Transformer, 300 pairs of `corpus` (a spec), small vocabulary."""
    values = dict(
        model_family="transformer",
        model_config={**TINY_TRANSFORMER, "dropout": 0.1},
        corpus=corpus,
        max_train_samples=300,
        vocab_size=500,
        max_source_length=48,
        max_target_length=48,
        max_tokens=800,
        learning_rate=3e-3,
        warmup_steps=2,
        max_steps=6,
        eval_every=3,
        save_every=2,
        max_eval_samples=8,
        eval_num_beams=2,
        eval_batch_size=8,
        max_test_samples=8,
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
    assert "schedule must be one of 'inverse_sqrt', 'linear', 'linear_time', 'constant', 'plateau'; got 'cosine'" in err


def test_command_line_overrides_recipe_and_merges_model_config(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model_family": "transformer",
                "model_config": {"d_model": 256, "encoder_layers": 3},
                "learning_rate": 1e-3,
                "max_steps": 100,
            }
        )
    )
    config = parse_command_line(
        TrainConfig,
        [
            "--recipe",
            str(recipe),
            "--learning_rate=5e-4",
            "--model_config.d_model",
            "128",
            "--resume",
            "--max_time_minutes",
            "null",
            "--eval_max_examples",
            "null",
        ],
    )
    assert config.learning_rate == 5e-4 and config.max_steps == 100 and config.resume is True
    assert config.model_config == {"d_model": 128, "encoder_layers": 3}  # one key changed, the other kept
    assert config.max_eval_samples is None


def test_wrong_types_and_inconsistent_limits_are_rejected():
    with pytest.raises(RecipeError, match="field 'max_steps' must be int"):
        config_from_dict(TrainConfig, {"max_steps": "ten"})
    # `mixed_precision: no` in a YAML recipe arrives as False: the message says to quote it
    with pytest.raises(
        RecipeError, match=r"field 'mixed_precision' must be str or null; got False \(YAML reads an unquoted no"
    ):
        config_from_dict(TrainConfig, yaml.safe_load("mixed_precision: no"))
    with pytest.raises(RecipeError, match="set at least one of max_steps, max_epochs, max_time_minutes"):
        validate_config(TrainConfig())
    with pytest.raises(RecipeError, match="average_best_k .* keep_best_k"):
        validate_config(TrainConfig(max_steps=1, average_best_k=3, keep_best_k=1))
    with pytest.raises(RecipeError, match="model_family must be one of 'rnn', 'transformer'; got 'lstm'"):
        validate_config(TrainConfig(max_steps=1, model_family="lstm"))
    # transformers refuses to save a generation_config with a length penalty and one beam: caught
    # here, not after the run
    with pytest.raises(
        RecipeError, match=r"length_penalty \(0.6\) applies to beam search only; it needs test_num_beams > 1"
    ):
        validate_config(TrainConfig(max_steps=1, length_penalty=0.6, test_num_beams=1))
    validate_config(TrainConfig(max_steps=1, length_penalty=0.6, test_num_beams=4))


def test_subword_sampling_options_are_checked_against_the_tokenizer_type():
    with pytest.raises(RecipeError, match="subword_alpha samples unigram segmentations; tokenizer_type is 'bpe'"):
        validate_config(TrainConfig(max_steps=1, tokenizer_type="bpe", subword_alpha=0.2))
    with pytest.raises(RecipeError, match="bpe_dropout needs tokenizer_type 'bpe'; got 'unigram'"):
        validate_config(TrainConfig(max_steps=1, bpe_dropout=0.1))
    with pytest.raises(RecipeError, match="subword_nbest_size needs subword_alpha"):
        validate_config(TrainConfig(max_steps=1, subword_nbest_size=8))
    with pytest.raises(RecipeError, match="subword_alpha above 1 needs subword_nbest_size"):
        validate_config(TrainConfig(max_steps=1, subword_alpha=2.0))
    with pytest.raises(RecipeError, match="subword_alpha must be > 0"):
        validate_config(TrainConfig(max_steps=1, subword_alpha=-1.0))
    with pytest.raises(RecipeError, match=r"bpe_dropout must be in \(0, 1\)"):
        validate_config(TrainConfig(max_steps=1, tokenizer_type="bpe", bpe_dropout=1.5))
    validate_config(TrainConfig(max_steps=1, subword_alpha=0.2, subword_nbest_size=64))
    # a saved tokenizer's type is only known once it is loaded: checked by the trainer, naming the option
    bpe = types.SimpleNamespace(backend_tokenizer=types.SimpleNamespace(model=tokenizers.models.BPE()))
    config = TrainConfig(max_steps=1, subword_alpha=0.2, tokenizer_path="saved/bpe")
    validate_config(config)
    with pytest.raises(
        RecipeError,
        match="subword_alpha samples unigram segmentations, but the tokenizer from "
        "tokenizer_path saved/bpe is BPE; use bpe_dropout",
    ):
        train_module.build_subword_resampling(config, None, None, bpe, None)
    validate_config(TrainConfig(max_steps=1, tokenizer_type="bpe", bpe_dropout=0.1))


def test_model_config_keys_and_values_are_checked_before_any_data_is_loaded():
    with pytest.raises(
        RecipeError, match=r"unknown key 'd_modle' for TransformerSeq2SeqConfig \(did you mean 'd_model'"
    ):
        validate_config(TrainConfig(max_steps=1, model_config={"d_modle": 128}))
    with pytest.raises(
        RecipeError, match="model_config: window must be one of 'global', 'local-m', 'local-p'; got 'local-x'"
    ):
        validate_config(
            TrainConfig(max_steps=1, model_family="rnn", model_config={"attention": "luong", "window": "local-x"})
        )


def test_num_threads_must_be_positive_or_null():
    with pytest.raises(RecipeError, match=r"num_threads must be >= 1 or null \(torch's default\); got 0"):
        validate_config(TrainConfig(max_steps=1, num_threads=0))
    validate_config(TrainConfig(max_steps=1, num_threads=None))


# Every recipe of train.py; finetune-*.yaml belong to training/finetune_trainer.py.
TRAIN_RECIPES = sorted(p.name for p in RECIPES.glob("*.yaml") if not p.name.startswith("finetune-"))


@pytest.mark.parametrize("recipe", TRAIN_RECIPES)
def test_shipped_recipes_are_valid_and_build_their_model_config(recipe):
    import attention_seq2seq as pkg

    config = config_from_dict(TrainConfig, load_recipe(RECIPES / recipe))
    validate_config(config)
    config_cls = pkg.RNNSeq2SeqConfig if config.model_family == "rnn" else pkg.TransformerSeq2SeqConfig
    config_cls(vocab_size=config.vocab_size, **config.model_config)  # the model config accepts every key


def test_recipe_round_trips_through_recipe_yaml(tmp_path):
    from attention_seq2seq.training.config import dump_recipe

    config = TrainConfig(max_steps=5, model_config={"d_model": 64}, max_eval_samples=None)
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
        model = pkg.TransformerSeq2SeqForConditionalGeneration(
            pkg.TransformerSeq2SeqConfig(vocab_size=40, dropout=0.0, **TINY_TRANSFORMER)
        )
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
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), mb["labels"].flatten(), label_smoothing=label_smoothing
            )
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


@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_weight_decay_shrinks_matrices_and_embeddings_but_not_biases_or_layer_norms(family):
    import attention_seq2seq as pkg

    torch.manual_seed(0)
    if family == "rnn":
        model = pkg.RNNSeq2SeqForConditionalGeneration(pkg.RNNSeq2SeqConfig(vocab_size=40, **TINY_RNN))
    else:
        model = pkg.TransformerSeq2SeqForConditionalGeneration(
            pkg.TransformerSeq2SeqConfig(vocab_size=40, **TINY_TRANSFORMER)
        )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    lr, weight_decay = 0.1, 0.5
    groups = optimizer_param_groups(model, weight_decay)
    # Every trainable tensor once, the tied lm_head / embedding matrix included.
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    optimizer = torch.optim.AdamW(groups, lr=lr)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # a zero gradient: AdamW's step is the decay alone
    optimizer.step()
    for name, p in model.named_parameters():
        expected = before[name] * (1 - lr * weight_decay) if p.dim() >= 2 else before[name]
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-7, msg=name)
    assert any(p.dim() == 1 for p in model.parameters())  # the negative side was exercised
    # Without decay: one group, as the optimizer states of older checkpoints have (resumable).
    assert [len(g["params"]) for g in optimizer_param_groups(model, 0.0)] == [len(list(model.parameters()))]
    if family == "transformer":
        assert all(p.dim() == 1 for n, p in model.named_parameters() if "layer_norm" in n)


def test_the_trainer_builds_its_adamw_from_the_decay_groups(pairs_corpus, tmp_path, monkeypatch):
    seen = []

    def spy(model, weight_decay):
        groups = optimizer_param_groups(model, weight_decay)
        seen.append((weight_decay, groups))
        return groups

    monkeypatch.setattr(build_module, "optimizer_param_groups", spy)
    train(
        tiny_config(
            pairs_corpus,
            tmp_path / "run",
            weight_decay=0.3,
            max_steps=1,
            eval_every=100,
            save_every=100,
            num_plot_sentences=0,
            max_test_samples=2,
        )
    )
    assert [(wd, [g["weight_decay"] for g in groups]) for wd, groups in seen] == [(0.3, [0.3, 0.0])]


def test_update_with_coverage_follows_the_models_own_loss_gradient():
    """The trainer's summed loss keeps the RNN's coverage term (See et al. 2017): its gradient,
    divided by the target tokens, equals the gradient of the model's own mean loss."""
    from accelerate import Accelerator

    import attention_seq2seq as pkg

    pairs = _random_pairs(4, vocab=40, seed=3)
    config = pkg.RNNSeq2SeqConfig(
        vocab_size=40,
        dropout=0.0,
        attention="bahdanau",
        coverage=True,
        coverage_loss_weight=2.0,
        label_smoothing=0.1,
        **{k: v for k, v in TINY_RNN.items() if k not in ("attention", "input_feeding", "score")},
    )
    batch = {k: v for k, v in Collate(pad_token_id=0, decoder_start_token_id=1)(pairs).items() if k != "id"}

    def grads(use_trainer: bool) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        model = pkg.RNNSeq2SeqForConditionalGeneration(config)
        if use_trainer:
            accelerator = Accelerator(cpu=True)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
            optimizer.zero_grad = lambda *a, **k: None  # keep the gradients for the comparison
            optimizer_update(accelerator, model, optimizer, scheduler, [batch], 0.1, max_grad_norm=0.0)
        else:
            model(**batch).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ours, reference = grads(True), grads(False)
    assert ours.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-6, rtol=1e-4, msg=name)


def test_symmetric_kl_sum_matches_the_two_kl_divergences():
    from attention_seq2seq.training.train import symmetric_kl_sum

    # By hand: p = softmax([0, ln 3]) = (1/4, 3/4), q = (1/2, 1/2):
    # KL(p||q) = 1/4 ln(1/2) + 3/4 ln(3/2), KL(q||p) = 1/2 ln 2 + 1/2 ln(2/3).
    p_logits = torch.tensor([[0.0, math.log(3.0)]])
    q_logits = torch.tensor([[5.0, 5.0]])
    by_hand = 0.25 * math.log(0.5) + 0.75 * math.log(1.5) + 0.5 * math.log(2.0) + 0.5 * math.log(2.0 / 3.0)
    assert symmetric_kl_sum(p_logits, q_logits).item() == pytest.approx(by_hand, rel=1e-6)
    # Several positions, half-precision input: the sum of torch's KL both ways, in float32.
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(7, 11, generator=g), torch.randn(7, 11, generator=g)
    la, lb = a.log_softmax(-1), b.log_softmax(-1)
    reference = torch.nn.functional.kl_div(lb, la, log_target=True, reduction="sum") + torch.nn.functional.kl_div(
        la, lb, log_target=True, reduction="sum"
    )
    assert symmetric_kl_sum(a, b).item() == pytest.approx(reference.item(), rel=1e-5)
    out = symmetric_kl_sum(a.bfloat16(), b.bfloat16())
    assert out.dtype == torch.float32 and out.item() == pytest.approx(reference.item(), rel=0.05)
    assert symmetric_kl_sum(a, a).item() == pytest.approx(0.0, abs=1e-6)


def _rdrop_update(alpha: float, dropout: float, by_hand: bool):
    """One R-Drop update of a seeded tiny Transformer, through `optimizer_update` or through the
    objective written out here (Liang et al. 2021, eq. 3, over the tokens of both copies).

    Returns ``(gradients, loss per token)``; the loss is `optimizer_update`'s reported
    cross-entropy over its token count (None by hand).
    """
    from accelerate import Accelerator

    import attention_seq2seq as pkg

    pairs = _random_pairs(5, vocab=40, seed=4)
    batch = {k: v for k, v in Collate(pad_token_id=0, decoder_start_token_id=1)(pairs).items() if k != "id"}
    torch.manual_seed(0)
    model = pkg.TransformerSeq2SeqForConditionalGeneration(
        pkg.TransformerSeq2SeqConfig(vocab_size=40, dropout=dropout, **TINY_TRANSFORMER)
    )
    model.train()
    torch.manual_seed(1)  # the same dropout masks on both paths
    loss_per_token = None
    if by_hand:
        double = {k: torch.cat([v, v]) for k, v in batch.items()}
        logits = model(
            **{k: double[k] for k in ("input_ids", "attention_mask", "decoder_input_ids")}, use_cache=False
        ).logits
        ce = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), double["labels"].flatten(), label_smoothing=0.1, reduction="sum"
        )
        keep = batch["labels"] != -100
        first, second = logits.chunk(2)
        kl = torch.nn.functional.kl_div(
            second[keep].log_softmax(-1), first[keep].log_softmax(-1), log_target=True, reduction="sum"
        ) + torch.nn.functional.kl_div(
            first[keep].log_softmax(-1), second[keep].log_softmax(-1), log_target=True, reduction="sum"
        )
        ((ce + alpha / 2 * kl) / (2 * keep.sum())).backward()
    else:
        accelerator = Accelerator(cpu=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        optimizer.zero_grad = lambda *a, **k: None  # keep the gradients for the comparison
        loss, tokens = optimizer_update(
            accelerator, model, optimizer, scheduler, [batch], 0.1, max_grad_norm=0.0, rdrop_alpha=alpha
        )
        loss_per_token = (loss / tokens).item()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, loss_per_token


def test_rdrop_update_follows_the_papers_objective():
    (ours, _), (reference, _) = _rdrop_update(5.0, 0.3, by_hand=False), _rdrop_update(5.0, 0.3, by_hand=True)
    assert ours.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(ours[name], reference[name], atol=1e-6, rtol=1e-4, msg=name)
    # The KL term is really there: a much larger alpha moves the gradient.
    heavier, _ = _rdrop_update(50.0, 0.3, by_hand=False)
    assert max((heavier[k] - ours[k]).abs().max().item() for k in ours) > 1e-4


def test_rdrop_without_dropout_is_the_plain_update():
    # Two copies without dropout agree exactly: the KL term is 0 and the mean over both copies'
    # tokens is the plain mean, so R-Drop must give the plain update's gradient.
    (plain, plain_loss), (rdrop, rdrop_loss) = (
        _rdrop_update(0.0, 0.0, by_hand=False),
        _rdrop_update(5.0, 0.0, by_hand=False),
    )
    assert rdrop_loss == pytest.approx(plain_loss, rel=1e-5)
    assert plain.keys() == rdrop.keys()
    for name in plain:
        torch.testing.assert_close(rdrop[name], plain[name], atol=1e-6, rtol=1e-4, msg=name)


def test_negative_rdrop_alpha_is_refused():
    with pytest.raises(RecipeError, match="rdrop_alpha must be >= 0"):
        validate_config(TrainConfig(max_steps=1, rdrop_alpha=-1.0))


# ------------------------------------------------------------------------ source word dropout
def test_source_word_dropout_replaces_a_p_share_of_real_tokens_by_unk_and_nothing_else():
    from attention_seq2seq.training.train import source_word_dropout

    pad, eos, unk = 0, 2, 3
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 40, (200,), generator=g)
    input_ids = torch.randint(4, 500, (200, 40), generator=g)
    attention_mask = (torch.arange(40)[None] < lengths[:, None]).long()
    input_ids[torch.arange(200), lengths - 1] = eos
    input_ids[attention_mask == 0] = pad
    before = input_ids.clone()

    torch.manual_seed(7)
    out = source_word_dropout(input_ids, attention_mask, 0.25, unk, keep_ids=(eos,))
    assert torch.equal(input_ids, before)  # the input is not modified
    changed = out != input_ids
    assert torch.all(out[changed] == unk)  # a dropped token becomes <unk>, nothing else
    assert not changed[attention_mask == 0].any() and torch.equal(out[input_ids == eos], input_ids[input_ids == eos])
    droppable = (attention_mask == 1) & (input_ids != eos)
    share = changed.sum().item() / droppable.sum().item()
    n = droppable.sum().item()
    assert abs(share - 0.25) < 4 * (0.25 * 0.75 / n) ** 0.5, share  # ~4,000 draws: within 4 standard errors

    torch.manual_seed(7)  # seeded: the same draw again; another seed: another draw
    assert torch.equal(source_word_dropout(input_ids, attention_mask, 0.25, unk, keep_ids=(eos,)), out)
    assert not torch.equal(source_word_dropout(input_ids, attention_mask, 0.25, unk, keep_ids=(eos,)), out)
    assert source_word_dropout(input_ids, attention_mask, 0.0, unk) is input_ids


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_source_word_dropout_outside_0_1_is_refused(p):
    with pytest.raises(RecipeError, match=r"source_word_dropout must be in \[0, 1\)"):
        validate_config(TrainConfig(max_steps=1, source_word_dropout=p))


@pytest.mark.parametrize("p", [0.0, 0.4])
def test_training_feeds_the_model_word_dropped_sources(pairs_corpus, tmp_path, monkeypatch, p):
    # What the model is trained on: with source_word_dropout the source batches carry <unk> in
    # place of about p of their real tokens (never </s>); without it, none.
    seen = []
    original = train_module.optimizer_update

    def spy(accelerator, model, optimizer, scheduler, micro, *args, **kwargs):
        seen.extend(
            {"input_ids": mb["input_ids"].clone(), "attention_mask": mb["attention_mask"].clone()} for mb in micro
        )
        return original(accelerator, model, optimizer, scheduler, micro, *args, **kwargs)

    monkeypatch.setattr(train_module, "optimizer_update", spy)
    run = train(
        tiny_config(
            pairs_corpus,
            tmp_path / "run",
            source_word_dropout=p,
            max_steps=4,
            eval_every=100,
            save_every=100,
            num_plot_sentences=0,
            max_test_samples=2,
        )
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(run / "model"))
    unk, eos = tokenizer.unk_token_id, tokenizer.eos_token_id
    real = torch.cat([mb["input_ids"][mb["attention_mask"] == 1] for mb in seen])
    assert len(seen) == 4 and (real == eos).sum() == sum(len(mb["input_ids"]) for mb in seen)  # every </s> kept
    share = (real == unk).sum().item() / (real != eos).sum().item()
    if p == 0:
        assert share == 0
    else:
        assert abs(share - p) < 0.06, share


def test_collate_shifts_labels_behind_the_start_token():
    batch = Collate(pad_token_id=0, decoder_start_token_id=1)(
        [{"input_ids": [5, 6, 2], "labels": [7, 8, 9, 2], "id": 4}, {"input_ids": [5, 2], "labels": [7, 2], "id": 9}]
    )
    # shift_tokens_right: the short row's </s> becomes an input at a padded (ignored) position.
    assert batch["decoder_input_ids"].tolist() == [[1, 7, 8, 9], [1, 7, 2, 0]]
    assert batch["labels"].tolist() == [[7, 8, 9, 2], [7, 2, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["id"].tolist() == [4, 9]


# ------------------------------------------------------------------------------- end-to-end runs
def _checkpoint_steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))


def test_output_folder_follows_the_design_contract(pairs_corpus, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    run = train(tiny_config(pairs_corpus, tmp_path / "run", keep_best_k=2, length_penalty=1.3))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["model_family"] == "transformer_seq2seq"
    assert (metrics["corpus"]["source_lang"], metrics["corpus"]["target_lang"]) == pairs_languages()
    assert metrics["train"]["steps"] == 6 and metrics["train"]["world_size"] == 1
    assert metrics["train"]["target_tokens_per_s"] > 0
    assert [v["step"] for v in metrics["validation"]] == [3, 6]
    # What produced the run, for a results row: the checkout's commit, the host, the versions.
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert metrics["run"]["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    assert metrics["run"]["host"]["logical_cpus"] == os.cpu_count() and metrics["run"]["host"]["cpu"]
    assert metrics["run"]["versions"]["torch"] == torch.__version__ and metrics["run"]["finished_utc"][:2] == "20"
    (test,) = metrics["test"].values()
    assert test["num_sentences"] == 8 and test["num_beams"] == 2 and "tok:13a" in test["bleu_signature"]
    assert len((run / "test_translations.txt").read_text().splitlines()) == 8
    assert (run / "plots" / "attention_test_0.png").stat().st_size > 1000
    assert (run / "plots" / "attention_val_step3_0.png").exists()
    assert _checkpoint_steps(run) == ["step_4", "step_6"]  # keep_last_checkpoints=2
    assert sorted(p.name for p in (run / "best").iterdir()) == ["step_3", "step_6"]
    assert not list((run / "checkpoints").glob(".tmp*"))
    # The final model is the best validation's weights, and it loads with the Auto classes.
    best_step = max(metrics["validation"], key=lambda v: (v["bleu"], v["step"]))["step"]
    assert metrics["train"]["final_model"] == f"best validation bleu (update {best_step})"
    model = AutoModelForSeq2SeqLM.from_pretrained(run / "model")
    assert_same_weights(
        {k: v for k, v in model.state_dict().items() if k in weights_of(run / "best" / f"step_{best_step}")},
        weights_of(run / "best" / f"step_{best_step}"),
        atol=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(run / "model")
    assert model.generation_config.num_beams == 2 and tokenizer.pad_token_id == 0
    assert model.generation_config.length_penalty == 1.3
    # recipe.yaml re-creates the same hyperparameters.
    assert config_from_dict(TrainConfig, load_recipe(run / "recipe.yaml")) == tiny_config(
        pairs_corpus, run, keep_best_k=2, length_penalty=1.3
    )


def test_average_last_k_builds_the_mean_of_the_kept_checkpoints(pairs_corpus, tmp_path):
    run = train(tiny_config(pairs_corpus, tmp_path / "run", average_last_k=2, num_plot_sentences=0, eval_every=6))
    a, b = weights_of(run / "checkpoints" / "step_4"), weights_of(run / "checkpoints" / "step_6")
    final = weights_of(run / "model")
    for key in a:
        torch.testing.assert_close(final[key], (a[key] + b[key]) / 2)
    assert "average of the last 2 checkpoints" in json.loads((run / "metrics.json").read_text())["train"]["final_model"]


def _crash_after_the_checkpoint_of(step: int, monkeypatch) -> None:
    """Make the next run raise right after it wrote the checkpoint of update ``step`` (a crash
    there); the one after runs normally."""
    original = train_module.save_checkpoint

    def save_then_crash(accelerator, root, at, *args, **kwargs):
        original(accelerator, root, at, *args, **kwargs)
        if at == step:
            monkeypatch.setattr(train_module, "save_checkpoint", original)
            raise RuntimeError(f"simulated crash after update {step}")

    monkeypatch.setattr(train_module, "save_checkpoint", save_then_crash)


@pytest.mark.device  # Accelerate puts the run on the GPU where torch sees one (scripts/gpu_check.sh)
def test_resume_after_a_crash_ends_with_the_weights_of_an_uninterrupted_run(pairs_corpus, tmp_path, monkeypatch):
    # 120 pairs and 2 accumulated micro-batches per update: the 6 updates cross epoch
    # boundaries, the crash falls mid-epoch, and dropout makes the RNG state matter.
    common = dict(max_train_samples=120, gradient_accumulation_steps=2, num_plot_sentences=0)
    full = train(tiny_config(pairs_corpus, tmp_path / "full", **common))
    # Same tokenizer: subword training itself is not bitwise reproducible between two runs.
    common["tokenizer_path"] = str(full / "model")
    crashing = tiny_config(pairs_corpus, tmp_path / "crashed", **common)
    _crash_after_the_checkpoint_of(4, monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash after update 4"):
        train(crashing)
    assert _checkpoint_steps(tmp_path / "crashed") == ["step_2", "step_4"]
    with pytest.raises(FileExistsError, match="--resume"):
        train(crashing)
    resumed = train(dataclasses.replace(crashing, resume=True))
    assert_same_weights(
        weights_of(full / "checkpoints" / "step_6"), weights_of(resumed / "checkpoints" / "step_6"), atol=0
    )
    m_full, m_resumed = (json.loads((r / "metrics.json").read_text()) for r in (full, resumed))
    assert m_full["validation"] == m_resumed["validation"]
    assert m_full["train"]["epochs"] == m_resumed["train"]["epochs"] > 1.0


def _to_legacy_layout(checkpoint: Path) -> None:
    """Rewrite a checkpoint as the trainer wrote it before training_state.pt: the loop's state in
    accelerate's custom_checkpoint_<i>.pkl files, numbered by registration order (scheduler,
    plateau, trainer state, then the linear_time clock)."""
    saved = torch.load(checkpoint / STATE_FILE)
    legacy = [saved["schedule"]["lr_scheduler"], saved["schedule"]["plateau"], saved["trainer"]]
    if "time_budget" in saved["schedule"]:
        legacy.append(saved["schedule"]["time_budget"])
    for index, state in enumerate(legacy):
        torch.save(state, checkpoint / f"custom_checkpoint_{index}.pkl")
    (checkpoint / STATE_FILE).unlink()


def test_a_checkpoint_written_before_training_state_pt_still_resumes_exactly(pairs_corpus, tmp_path, monkeypatch):
    # The plateau schedule (patience 1, factor 0.5) makes the restored plateau state matter.
    common = dict(
        max_train_samples=120,
        gradient_accumulation_steps=2,
        num_plot_sentences=0,
        schedule="plateau",
        plateau_patience=1,
        warmup_steps=0,
    )
    full = train(tiny_config(pairs_corpus, tmp_path / "full", **common))
    common["tokenizer_path"] = str(full / "model")
    crashing = tiny_config(pairs_corpus, tmp_path / "crashed", **common)
    _crash_after_the_checkpoint_of(4, monkeypatch)
    with pytest.raises(RuntimeError, match="simulated crash after update 4"):
        train(crashing)
    _to_legacy_layout(tmp_path / "crashed" / "checkpoints" / "step_4")
    resumed = train(dataclasses.replace(crashing, resume=True))
    assert_same_weights(
        weights_of(full / "checkpoints" / "step_6"), weights_of(resumed / "checkpoints" / "step_6"), atol=0
    )
    m_full, m_resumed = (json.loads((r / "metrics.json").read_text()) for r in (full, resumed))
    assert m_full["validation"] == m_resumed["validation"]
    s_full, s_resumed = (torch.load(r / "checkpoints" / "step_6" / STATE_FILE) for r in (full, resumed))
    assert s_full["schedule"] == s_resumed["schedule"]  # lr multiplier and plateau state carried over
    clock = ("wall_time_s", "train_time_s", "train_loss")  # wall-clock times, and the loss logs of the lost updates
    assert {k: v for k, v in s_full["trainer"].items() if k not in clock} == {
        k: v for k, v in s_resumed["trainer"].items() if k not in clock
    }


def test_legacy_custom_checkpoint_files_map_to_the_objects_registered_in_that_order(tmp_path):
    from attention_seq2seq.training.checkpoints import read_training_state

    states = [
        {"last_epoch": 7},
        {"multiplier": 0.25, "best": 3.0, "bad_validations": 1},
        {"step": 7},
        {"budget_s": 60.0},
    ]
    for index, state in enumerate(states):
        torch.save(state, tmp_path / f"custom_checkpoint_{index}.pkl")
    assert read_training_state(tmp_path) == {
        "trainer": {"step": 7},
        "schedule": {"lr_scheduler": {"last_epoch": 7}, "plateau": states[1], "time_budget": {"budget_s": 60.0}},
    }
    (tmp_path / "custom_checkpoint_3.pkl").unlink()  # a run without linear_time saved no clock
    assert "time_budget" not in read_training_state(tmp_path)["schedule"]
    with pytest.raises(FileNotFoundError, match="not a training checkpoint"):
        read_training_state(tmp_path / "nothing")


def test_an_interrupted_checkpoint_save_keeps_the_previous_one(pairs_corpus, tmp_path, monkeypatch):
    from accelerate import Accelerator

    real_save = Accelerator.save_state

    def save_then_die(self, output_dir=None, **kwargs):
        real_save(self, output_dir, **kwargs)
        if Path(output_dir).name == ".step_4.tmp":  # write_atomically's temporary name
            (Path(output_dir) / "model.safetensors").write_bytes(b"torn")  # a half-written file
            raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr(Accelerator, "save_state", save_then_die)
    config = tiny_config(pairs_corpus, tmp_path / "run", num_plot_sentences=0, eval_every=100)
    with pytest.raises(KeyboardInterrupt):
        train(config)
    assert _checkpoint_steps(tmp_path / "run") == ["step_2"]
    monkeypatch.setattr(Accelerator, "save_state", real_save)
    run = train(dataclasses.replace(config, resume=True))  # resumes from step_2, ignoring the torn .tmp folder
    assert _checkpoint_steps(run) == ["step_4", "step_6"]
    assert json.loads((run / "metrics.json").read_text())["train"]["steps"] == 6


def test_non_finite_loss_stops_naming_the_update_and_keeps_the_last_good_checkpoint(
    pairs_corpus, tmp_path, monkeypatch
):
    real_loss = objectives.token_loss_sum
    training_calls = []

    def loss_that_explodes(logits, labels, label_smoothing, *args, **kwargs):
        loss = real_loss(logits, labels, label_smoothing, *args, **kwargs)
        if torch.is_grad_enabled():  # training, not validation
            training_calls.append(1)
            if len(training_calls) == 3:
                return loss * float("nan")
        return loss

    monkeypatch.setattr(objectives, "token_loss_sum", loss_that_explodes)
    config = tiny_config(
        pairs_corpus, tmp_path / "run", log_every=10, save_every=2, eval_every=100, num_plot_sentences=0
    )
    with pytest.raises(FloatingPointError, match="not finite at update 3"):
        train(config)
    # Detected at the next sync point (the checkpoint of update 4), before anything was saved.
    assert _checkpoint_steps(tmp_path / "run") == ["step_2"]
    assert all(torch.isfinite(t).all() for t in weights_of(tmp_path / "run" / "checkpoints" / "step_2").values())
    assert not (tmp_path / "run" / "metrics.json").exists()


_RANKS_TIMEOUT_S = 300  # each two-rank run takes about 15 s here


def _launch_two_cpu_ranks(config: TrainConfig, recipe: Path) -> subprocess.CompletedProcess:
    """Run the training script as two gloo ranks (``accelerate launch --multi_gpu``) on ``config``
    and check that they formed one group of two; returns the finished process."""
    recipe.write_text(yaml.safe_dump(dataclasses.asdict(config)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    accelerate = Path(sys.executable).with_name("accelerate")
    command = [
        str(accelerate),
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
        "-m",
        "attention_seq2seq.training.train",
        "--recipe",
        str(recipe),
    ]
    proc = run_process_tree(command, _RANKS_TIMEOUT_S, cwd=REPO_ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world size 2" in proc.stderr
    assert json.loads((Path(config.output_dir) / "metrics.json").read_text())["train"]["world_size"] == 2
    return proc


@pytest.mark.slow
def test_two_cpu_ranks_equal_one_process_accumulating_their_batches(pairs_corpus, tmp_path):
    # No dropout: each rank draws its own masks, which one process cannot reproduce. The schedule
    # follows the wall clock (linear_time, a 10-hour budget: the rate falls by ~1e-4 of itself in
    # this run): the ranks agree on the slowest clock, so their weights stay bit-identical.
    overrides = dict(
        model_config={**TINY_TRANSFORMER, "dropout": 0.0},
        max_train_samples=200,
        max_steps=4,
        eval_every=4,
        save_every=4,
        num_plot_sentences=0,
        debug_dump_batches=True,
        max_test_samples=4,
        eval_batch_size=2,  # two test batches: one per rank
        schedule="linear_time",
        max_time_minutes=600,
    )
    ddp = tiny_config(pairs_corpus, tmp_path / "ddp", **overrides)
    _launch_two_cpu_ranks(ddp, tmp_path / "ddp.yaml")
    # The ranks shared the test batches; together they wrote what one process translates.
    from attention_seq2seq.cli import main

    hypotheses = tmp_path / "evaluated.txt"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank ran (OMP_NUM_THREADS=1)
    try:
        argv = ["evaluate", "-m", str(tmp_path / "ddp"), "--corpus", pairs_corpus, "--limit", "4", "--batch-size", "2"]
        assert main([*argv, "--output", str(tmp_path / "e.json"), "--hypotheses", str(hypotheses)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert hypotheses.read_text(encoding="utf-8") == (tmp_path / "ddp" / "test_translations.txt").read_text("utf-8")

    def batches(path):
        return [json.loads(line) for line in path.read_text().splitlines()]

    rank0, rank1 = (batches(tmp_path / "ddp" / "debug" / f"batches_rank{r}.jsonl") for r in (0, 1))
    assert len(rank0) == len(rank1) == 4
    ids0, ids1 = ({i for b in r for i in b["ids"]} for r in (rank0, rank1))
    assert ids0 and ids1 and not ids0 & ids1  # disjoint examples
    w0, w1 = (load_file(str(tmp_path / "ddp" / "debug" / f"weights_rank{r}.safetensors")) for r in (0, 1))
    assert_same_weights(w0, w1, atol=0)

    # One process, accumulating rank 0's and rank 1's micro-batch of each update.
    single = train(
        dataclasses.replace(
            ddp,
            output_dir=str(tmp_path / "single"),
            gradient_accumulation_steps=2,
            tokenizer_path=str(tmp_path / "ddp" / "model"),
        )
    )
    micro = batches(single / "debug" / "batches_rank0.jsonl")
    assert [b["ids"] for b in micro if b["micro"] == 0] == [b["ids"] for b in rank0]
    assert [b["ids"] for b in micro if b["micro"] == 1] == [b["ids"] for b in rank1]
    assert_same_weights(load_file(str(single / "debug" / "weights_rank0.safetensors")), w0, atol=1e-5)


# Toy widths of two shipped architectures, and the updates each needs on 3,000 Multi30k pairs to
# translate a little (about 40 s each on one CPU core).
REAL_DATA_RUNS = {
    "transformer": (
        {
            "d_model": 64,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 128,
            "decoder_ffn_dim": 128,
            "dropout": 0.1,
        },
        {"learning_rate": 5e-3},
    ),
    # RNNsearch (the Bahdanau recipe): GRU, additive attention, maxout deep output.
    "rnn": (
        {"cell_type": "gru", "embedding_size": 64, "hidden_size": 96, "attention": "bahdanau", "dropout": 0.1},
        {"learning_rate": 1e-2},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["transformer", "rnn"])
def test_short_real_data_run_learns_to_translate(family, shared_data, tmp_path):
    # The BLEU levels below are figures of Multi30k (3,000 pairs): skipped without ../shared/data.
    model_config, optimisation = REAL_DATA_RUNS[family]
    config = tiny_config(
        f"multi30k:{shared_data / 'multi30k'}:de-en",
        tmp_path / family,
        model_family=family,
        model_config=model_config,
        **optimisation,
        max_train_samples=3000,
        vocab_size=1000,
        max_source_length=40,
        max_target_length=40,
        max_tokens=1500,
        warmup_steps=20,
        max_steps=150,
        eval_every=75,
        save_every=150,
        log_every=10,
        max_eval_samples=60,
        eval_batch_size=60,
        max_test_samples=60,
    )
    metrics = json.loads((train(config) / "metrics.json").read_text())
    losses = [loss for _, loss in metrics["train"]["loss_history"]]
    assert losses[0] > 6.0 and losses[-1] < losses[0] - 1.5, losses  # from about ln(1000) = 6.9 downwards
    first, last = metrics["validation"]
    assert last["loss"] < first["loss"] and last["perplexity"] < first["perplexity"]
    # BLEU on 60 sentences is noisy between two close checkpoints; the level is the signal (an
    # untrained model scores 0.0 here, see test_output_folder_follows_the_design_contract's runs).
    assert last["bleu"] > 1.5 and last["chrf"] > 10.0, metrics["validation"]
    (test,) = metrics["test"].values()
    assert test["bleu"] > 1.5 and test["num_sentences"] == 60


def test_early_stopping_keeps_the_best_k_and_averages_them(pairs_corpus, tmp_path, monkeypatch):
    # Scripted validation scores: BLEU 5, 4, 3 at updates 2, 4, 6; patience 2 stops after update 6.
    real_evaluate = train_module.evaluate
    scripted = iter([5.0, 4.0, 3.0])

    def scripted_evaluate(model, dataset, tokenizer, config, accelerator, num_beams, max_examples, target_lang, *rest):
        result = real_evaluate(
            model, dataset, tokenizer, config, accelerator, num_beams, max_examples, target_lang, *rest
        )
        if num_beams == config.eval_num_beams and max_examples == config.max_eval_samples:  # validation
            result["bleu"] = next(scripted)
        return result

    monkeypatch.setattr(train_module, "evaluate", scripted_evaluate)
    config = tiny_config(
        pairs_corpus,
        tmp_path / "run",
        max_steps=20,
        eval_every=2,
        save_every=2,
        eval_num_beams=1,
        early_stopping_patience=2,
        keep_best_k=2,
        average_best_k=2,
        num_plot_sentences=0,
        schedule="plateau",
        plateau_patience=1,
        plateau_factor=0.5,
        warmup_steps=0,
    )
    run = train(config)
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["train"]["steps"] == 6 and metrics["train"]["stopped_by"] == "early_stopping"
    assert [v["bleu"] for v in metrics["validation"]] == [5.0, 4.0, 3.0]
    assert sorted(p.name for p in (run / "best").iterdir()) == ["step_2", "step_4"]
    a, b, final = weights_of(run / "best" / "step_2"), weights_of(run / "best" / "step_4"), weights_of(run / "model")
    for key in a:
        torch.testing.assert_close(final[key], (a[key] + b[key]) / 2)
    # "plateau" (patience 1): the validations at updates 4 and 6 did not improve, so the rate was
    # halved for updates 5-6 and the multiplier stands at 1/4 for what would come next.
    checkpoint = run / "checkpoints" / "step_6"
    last_lr = torch.load(checkpoint / "optimizer.bin", weights_only=False)["param_groups"][0]["lr"]
    assert last_lr == pytest.approx(config.learning_rate * 0.5)
    assert torch.load(checkpoint / STATE_FILE)["schedule"]["plateau"]["multiplier"] == 0.25


def test_time_budget_stops_the_run_and_still_writes_the_model(pairs_corpus, tmp_path):
    config = tiny_config(pairs_corpus, tmp_path / "run", max_steps=1000, max_time_minutes=1e-4, num_plot_sentences=0)
    metrics = json.loads((train(config) / "metrics.json").read_text())
    assert metrics["train"]["stopped_by"] == "max_time_minutes" and metrics["train"]["steps"] == 1
    assert [v["step"] for v in metrics["validation"]] == [1]
    assert (tmp_path / "run" / "model" / "model.safetensors").exists()


def test_linear_time_schedule_anneals_a_time_limited_run_to_zero(pairs_corpus, tmp_path):
    config = tiny_config(
        pairs_corpus,
        tmp_path / "run",
        schedule="linear_time",
        max_steps=None,
        max_epochs=None,
        max_time_minutes=0.05,
        warmup_steps=1,
        eval_every=10**6,
        save_every=10**6,
        num_plot_sentences=0,
    )
    metrics = json.loads((train(config) / "metrics.json").read_text())
    assert metrics["train"]["stopped_by"] == "max_time_minutes" and metrics["train"]["steps"] > 5
    last = tmp_path / "run" / "checkpoints" / f"step_{metrics['train']['steps']}"
    scheduler = torch.load(last / STATE_FILE)["schedule"]["lr_scheduler"]
    clock = torch.load(last / STATE_FILE)["schedule"]["time_budget"]
    # One process reads the clock after every update: the decay starts after the single warm-up update.
    assert clock["budget_s"] == pytest.approx(3.0) and 0 < clock["decay_start_s"] < 1.5 and clock["elapsed_s"] >= 3.0
    # The rate the scheduler computed last (from the clock after the second-to-last update) is close
    # to 0: the run was annealed within its time budget.
    assert scheduler["_last_lr"][0] < 0.5 * config.learning_rate
    with pytest.raises(RecipeError, match="max_time_minutes > 0"):
        validate_config(dataclasses.replace(config, max_time_minutes=None, max_steps=5))
    with pytest.raises(RecipeError, match="schedule 'linear' decays to 0 at max_steps"):
        validate_config(dataclasses.replace(config, schedule="linear"))


def test_help_lists_every_field_with_its_comment(capsys):
    with pytest.raises(SystemExit):
        parse_command_line(TrainConfig, ["--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert f"--{f.name.replace('_', '-')} " in out  # one documented spelling, as the other commands write options
    assert "peak learning rate (AdamW)" in out


def test_options_take_either_spelling_and_old_names_keep_working(tmp_path):
    # --max-steps and --max_steps are one option; the trainer's old names of the sample limits
    # (max_train_examples, ...) still work in recipes and on the command line.
    recipe = tmp_path / "old.yaml"
    recipe.write_text("max_train_examples: 30\neval_max_examples: 4\ntest_max_examples: 5\nmax_steps: 3\n")
    config = parse_command_line(TrainConfig, ["--recipe", str(recipe), "--max-steps", "7", "--output_dir", "x"])
    assert (config.max_train_samples, config.max_eval_samples, config.max_test_samples) == (30, 4, 5)
    assert (config.max_steps, config.output_dir) == (7, "x")
    config = parse_command_line(TrainConfig, ["--max_train_examples", "9", "--max-train-samples", "11"])
    assert config.max_train_samples == 11  # the later one wins, whatever its spelling
    with pytest.raises(RecipeError, match="did you mean 'max_train_samples'"):
        parse_command_line(TrainConfig, ["--max_train_sample", "9"])


def test_bf16_mixed_precision_path_trains(pairs_corpus, tmp_path):
    # On a GPU this is the recipes' --mixed_precision bf16; CPU autocast runs the same code path.
    # A fresh process: Accelerate keeps one mixed-precision setting per process.
    config = tiny_config(pairs_corpus, tmp_path / "run", mixed_precision="bf16", eval_every=6, num_plot_sentences=1)
    (tmp_path / "bf16.yaml").write_text(yaml.safe_dump(dataclasses.asdict(config)))
    proc = subprocess.run(
        [sys.executable, "-m", "attention_seq2seq.training.train", "--recipe", str(tmp_path / "bf16.yaml")],
        cwd=REPO_ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "mixed precision bf16" in proc.stderr
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    losses = [loss for _, loss in metrics["train"]["loss_history"]]
    assert all(map(math.isfinite, losses)) and losses[-1] < losses[0]
    assert (tmp_path / "run" / "plots" / "attention_val_step6_0.png").exists()

    # The test scores are those of the saved model as users load it (float32), not of the
    # training's bf16 autocast forward: the teacher-forced test loss, recomputed both ways.
    from accelerate import Accelerator
    from transformers import AutoModelForSeq2SeqLM

    from attention_seq2seq.training.train import evaluate, load_data

    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "run" / "model")
    accelerator = Accelerator(cpu=True)
    data, _, tokenizer = load_data(config, accelerator, tmp_path / "run")

    def test_loss():
        return evaluate(
            model, data["test"], tokenizer, config, accelerator, config.test_num_beams, config.max_test_samples, "en"
        )["loss"]

    fp32 = test_loss()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = test_loss()
    reported = metrics["test"][_test_key(pairs_corpus)]["loss"]
    assert reported == pytest.approx(fp32, rel=1e-6)
    # The control: bf16 really computes other numbers. A model this briefly trained predicts
    # near-uniform distributions, whose loss hardly moves (4e-7 relative on the Bible fixture),
    # so the control compares the logits themselves.
    batch = tokenizer(data["test"]["source"][:4], return_tensors="pt", padding=True)
    start = torch.full((4, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        logits_fp32 = model(**batch, decoder_input_ids=start).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits_bf16 = model(**batch, decoder_input_ids=start).logits.float()
    assert (logits_bf16 - logits_fp32).abs().max() > 1e-4
    assert bf16 == pytest.approx(fp32, rel=1e-2)  # ... and the loss stays close


def test_test_greedy_adds_a_greedy_entry_scored_like_the_translations_it_writes(pairs_corpus, tmp_path, caplog):
    # ... and test_bootstrap gives both entries the confidence intervals of those translations.
    from attention_seq2seq.translation.scores import corpus_scores

    config = tiny_config(pairs_corpus, tmp_path / "run", test_greedy=True, num_threads=1, test_bootstrap=200)
    threads_before = torch.get_num_threads()
    try:
        run = train(config)
        assert torch.get_num_threads() == 1  # num_threads reached torch
    finally:
        torch.set_num_threads(threads_before)
    metrics = json.loads((run / "metrics.json").read_text())
    key = _test_key(pairs_corpus)
    beam, greedy = metrics["test"][key], metrics["test"][f"{key}-greedy"]
    assert beam["num_beams"] == 2 and greedy["num_beams"] == 1
    hyps = (run / "test_translations_greedy.txt").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == greedy["num_sentences"] == 8
    from attention_seq2seq.data import load_corpus

    refs = list(load_corpus(config.corpus)["test"]["target"][:8])
    rescored = corpus_scores(hyps, refs, "en", n_bootstrap=200)
    assert greedy["bleu"] == pytest.approx(rescored["bleu"]) and greedy["chrf"] == pytest.approx(rescored["chrf"])
    assert "case:lc" in greedy["bleu_lowercase_signature"] and greedy["bleu_lowercase"] >= 0.0
    for key in ("bleu_ci95", "bleu_lowercase_ci95", "chrf_ci95"):
        assert greedy[key] == pytest.approx(rescored[key]), key
    assert greedy["chrf_ci95"] > 0 and "bs:200" in greedy["chrf_signature"]
    beam_hyps = (run / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    assert beam["chrf_ci95"] == pytest.approx(corpus_scores(beam_hyps, refs, "en", n_bootstrap=200)["chrf_ci95"])
    assert f"chrF {greedy['chrf']:.2f} ± {greedy['chrf_ci95']:.2f}" in caplog.text  # the log line shows the interval
    assert (
        f"± {greedy['chrf_ci95']:.2f} ({greedy['bleu_signature']})" in caplog.text
    )  # ... and the greedy line its signature


def test_metrics_json_test_entries_are_what_evaluate_gives_line_for_line(pairs_corpus, tmp_path, capsys):
    # Training's test translations come from the evaluate command's engine (the same sort, batches,
    # truncation and strip), so metrics.json's beam and greedy entries are what `attention-seq2seq
    # evaluate` gives on the saved model: the same translations and the same scores. 40 sentences
    # in batches of the default eval_batch_size (32, evaluate's --batch-size): two batches.
    from attention_seq2seq.cli import main
    from attention_seq2seq.training.evaluation import SCORE_KEYS

    config = tiny_config(
        pairs_corpus,
        tmp_path / "run",
        eval_batch_size=TrainConfig.eval_batch_size,
        max_test_samples=40,
        test_greedy=True,
        num_plot_sentences=0,
    )
    run = train(config)
    metrics = json.loads((run / "metrics.json").read_text())
    key = _test_key(pairs_corpus)
    for entry, decoding, translations in [
        (key, [], "test_translations.txt"),
        (f"{key}-greedy", ["--greedy"], "test_translations_greedy.txt"),
    ]:
        out, hypotheses = tmp_path / f"{entry}.json", tmp_path / f"{entry}.txt"
        argv = ["evaluate", "-m", str(run), "--corpus", pairs_corpus, "--limit", "40", "--no-progress", *decoding]
        assert main([*argv, "--output", str(out), "--hypotheses", str(hypotheses)]) == 0
        assert hypotheses.read_text(encoding="utf-8") == (run / translations).read_text(encoding="utf-8")
        (evaluated,) = json.loads(out.read_text()).values()
        assert evaluated["num_sentences"] == metrics["test"][entry]["num_sentences"] == 40
        assert {k: evaluated[k] for k in SCORE_KEYS} == {k: metrics["test"][entry][k] for k in SCORE_KEYS}


def test_test_bootstrap_below_2_is_refused():
    with pytest.raises(RecipeError, match=r"test_bootstrap must be >= 2 resamples"):
        validate_config(TrainConfig(max_steps=1, test_bootstrap=1))


def test_rnn_without_attention_trains_validates_and_tests_without_heat_maps(pairs_corpus, tmp_path):
    # attention="none" has no cross-attention to draw: validation and the final test must still
    # run (this crashed at the first validation before plot_attention learned to skip it).
    model_config = {"embedding_size": 32, "hidden_size": 32, "attention": "none"}
    run = train(tiny_config(pairs_corpus, tmp_path / "run", model_family="rnn", model_config=model_config))
    metrics = json.loads((run / "metrics.json").read_text())
    assert [v["step"] for v in metrics["validation"]] == [3, 6]
    assert metrics["test"][_test_key(pairs_corpus)]["num_sentences"] == 8
    assert not list((run / "plots").glob("*.png"))


def test_subword_sampling_resegments_the_training_pairs_every_epoch(pairs_corpus, tmp_path, monkeypatch):
    from attention_seq2seq.data import tokenization

    draws = []
    original = tokenization.SubwordSampler.resample

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        draws.append(out)
        return out

    monkeypatch.setattr(tokenization.SubwordSampler, "resample", spy)
    config = tiny_config(
        pairs_corpus,
        tmp_path / "run",
        subword_alpha=0.3,
        max_steps=None,
        max_epochs=2.5,
        eval_every=10**6,
        save_every=10**6,
        num_plot_sentences=0,
        debug_dump_batches=True,
    )
    run = train(config)
    metrics = json.loads((run / "metrics.json").read_text())
    # max_epochs becomes updates with the best segmentation; sampled pieces are more, so fewer passes
    assert 2.0 < metrics["train"]["epochs"] < 2.5
    assert len(draws) == 3  # epochs 0, 1 and 2, each drawn once
    (ids0, labels0, _), (ids1, labels1, _) = draws[:2]
    pairs = len(ids0)
    assert pairs > 200 and len(ids1) == pairs and ids0 != ids1 and labels0 != labels1
    tokenizer = PreTrainedTokenizerFast.from_pretrained(run / "model")
    texts = tokenizer.batch_decode(ids0, skip_special_tokens=True)
    assert tokenizer.batch_decode(ids1, skip_special_tokens=True) == texts  # the same pairs, in the same order
    best = tokenizer(texts)["input_ids"]
    assert sum(map(len, ids0)) > sum(map(len, best))  # sampled: more, shorter pieces
    # every pair is used once per epoch, whatever its sampled length: 2 or 3 times in 2.5 epochs
    dumped = [json.loads(line) for line in (run / "debug" / "batches_rank0.jsonl").read_text().splitlines()]
    uses = collections.Counter(i for d in dumped for i in d["ids"])
    assert set(uses) == set(range(pairs)) and set(uses.values()) <= {2, 3}


@pytest.mark.slow
def test_two_cpu_ranks_share_each_epochs_sampled_segmentation(pairs_corpus, tmp_path):
    # Only the main process samples; the other rank must batch the very same sampled lengths, or
    # the two ranks' shares of an epoch (cut from each rank's own view of the lengths) would no
    # longer split the pairs between them: some would train twice in an epoch, others never.
    # max_epochs counts updates of the best segmentation; the sampled epochs are longer, so this
    # makes two whole sampled epochs and part of a third (6 updates per rank and epoch, against 7
    # or 8 sampled, in the runs measured here).
    config = tiny_config(
        pairs_corpus,
        tmp_path / "ddp",
        subword_alpha=0.3,
        max_steps=None,
        max_epochs=2.75,
        gradient_accumulation_steps=1,
        eval_every=10**6,
        save_every=10**6,
        num_plot_sentences=0,
        debug_dump_batches=True,
        max_test_samples=4,
    )
    proc = _launch_two_cpu_ranks(config, tmp_path / "ddp.yaml")

    def steps(rank):
        lines = (tmp_path / "ddp" / "debug" / f"batches_rank{rank}.jsonl").read_text().splitlines()
        return {d["step"]: d["ids"] for d in map(json.loads, lines)}

    rank0, rank1 = steps(0), steps(1)
    assert rank0.keys() == rank1.keys()
    pairs = int(re.search(r"(\d+) training pairs", proc.stderr).group(1))
    all_ids = set(range(pairs))
    epochs, seen = 0, set()
    for step in sorted(rank0):
        ids = set(rank0[step]) | set(rank1[step])
        assert not set(rank0[step]) & set(rank1[step]), f"update {step}: both ranks trained the same pair"
        assert not ids & seen, f"update {step}: a pair trained twice in one epoch"
        seen |= ids
        if seen == all_ids:
            epochs, seen = epochs + 1, set()
    assert pairs > 200 and epochs >= 2  # whole epochs, each pair exactly once in each
    # one draw per epoch begun, logged by the main process
    assert proc.stderr.count("sampled segmentations") == epochs + bool(seen)
    w0, w1 = (load_file(str(tmp_path / "ddp" / "debug" / f"weights_rank{r}.safetensors")) for r in (0, 1))
    assert_same_weights(w0, w1, atol=0)


def test_every_file_of_a_run_gets_the_mode_the_umask_gives(pairs_corpus, tmp_path):
    # safetensors (Accelerate's save_state and save_model, save_averaged) writes 0600; every file
    # of the run should get the mode config.json gets: 0666 less the umask (0640 under 027 here).
    from attention_seq2seq.training.averaging import save_averaged

    previous = os.umask(0o027)
    try:
        run = train(
            tiny_config(
                pairs_corpus,
                tmp_path / "run",
                max_steps=4,
                eval_every=2,
                save_every=2,
                keep_best_k=2,
                eval_num_beams=1,
                test_num_beams=1,
                num_plot_sentences=0,
                debug_dump_batches=True,
            )
        )
        averaged = save_averaged(
            [run / "checkpoints" / "step_2", run / "checkpoints" / "step_4"],
            tmp_path / "averaged" / "model.safetensors",
        )
    finally:
        os.umask(previous)
    assert (run / "checkpoints" / "step_4" / "model.safetensors").is_file()
    assert (run / "best" / "step_4" / "model.safetensors").is_file() and (run / "model" / "model.safetensors").is_file()
    assert (run / "debug" / "weights_rank0.safetensors").is_file()
    wrong = {
        str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
        for p in [*run.rglob("*"), averaged]
        if p.is_file() and p.stat().st_mode & 0o777 != 0o640
    }
    assert not wrong
    folders = {
        str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777)
        for p in [run, *run.rglob("*")]
        if p.is_dir() and p.stat().st_mode & 0o777 != 0o750
    }
    assert not folders


@pytest.mark.parametrize("recipe", TRAIN_RECIPES)
def test_shipped_recipes_do_fixed_work_and_carry_no_wall_clock_budget(recipe):
    """A shipped recipe gives the same model on a slow, busy or fast machine: it ends after a fixed
    number of updates (or epochs), its schedule decays by updates, and precision is measured
    (``auto``); a time budget is only ever an explicit --max_time_minutes."""
    config = config_from_dict(TrainConfig, load_recipe(RECIPES / recipe))
    assert config.max_time_minutes is None, f"{recipe}: max_time_minutes {config.max_time_minutes}"
    assert config.max_steps or config.max_epochs, f"{recipe}: neither max_steps nor max_epochs"
    assert config.schedule != "linear_time", f"{recipe}: the linear_time schedule follows the clock"
    assert config.mixed_precision == "auto", f"{recipe}: mixed_precision {config.mixed_precision!r}"
    text = (RECIPES / recipe).read_text(encoding="utf-8")
    assert not re.search(r"\bissue[- ]?\d", text, re.IGNORECASE), f"{recipe} names an issue number"
