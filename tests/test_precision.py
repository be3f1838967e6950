"""``mixed_precision: auto`` (training/precision.py): the decision rule, its cache, and a real
measurement of a tiny model, without asserting any wall-clock figure."""

from __future__ import annotations

import json

import pytest
import torch

from attention_seq2seq.training import precision
from helpers import tiny_model
from attention_seq2seq.training.precision import BF16_MIN_SPEEDUP, resolve_mixed_precision, synthetic_batch
from attention_seq2seq.training.train import CHOICES, TrainConfig, validate_config

TINY = dict(
    d_model=16,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return tmp_path / "cache"


def build_tiny_model():
    return tiny_model("transformer_seq2seq", 40, **TINY)


def fake_timer(float32_s, bf16_s, calls):
    def measure(model, batches, max_rounds=9, bf16=True):
        calls.append(bf16)
        return precision.StepTimes(float32_s, (bf16_s if bf16 else None), 0.01, 3)

    return measure


@pytest.mark.parametrize(
    "float32_s, bf16_s, expected",
    [
        (0.30, 0.20, "bf16"),  # 1.5x: bf16
        (0.20, 0.30, "no"),  # bf16 slower (the LSTM on an AMX Xeon; every model on a Xeon without AMX)
        (0.105, 0.100, "no"),  # 1.05x: not worth bf16's rounding
        (BF16_MIN_SPEEDUP * 0.1, 0.1, "bf16"),  # exactly the threshold
    ],
)
def test_auto_picks_bf16_only_when_measured_faster(cache_dir, monkeypatch, float32_s, bf16_s, expected):
    calls = []
    monkeypatch.setattr(precision, "measure_step_times", fake_timer(float32_s, bf16_s, calls))
    choice = resolve_mixed_precision("transformer", TINY, 40, 256, build_model=build_tiny_model)
    assert choice.mixed_precision == expected and calls == [True]
    assert choice.step_s == (bf16_s if expected == "bf16" else float32_s)
    assert f"{1000 * float32_s:.0f} ms in float32" in choice.reason and "measured now" in choice.reason


def test_auto_decision_is_kept_per_machine_and_model_shape(cache_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(precision, "measure_step_times", fake_timer(0.3, 0.2, calls))
    first = resolve_mixed_precision("transformer", TINY, 40, 256, build_model=build_tiny_model)
    # a later run on a loaded machine would measure the opposite: the cached decision stands
    monkeypatch.setattr(precision, "measure_step_times", fake_timer(0.2, 0.3, calls))
    again = resolve_mixed_precision("transformer", TINY, 40, 256, build_model=build_tiny_model)
    assert calls == [True] and again.cached and not first.cached
    assert again.mixed_precision == first.mixed_precision == "bf16" and "kept in" in again.reason
    # another model shape, or another batch size, is measured on its own
    other = resolve_mixed_precision("transformer", {**TINY, "d_model": 32}, 40, 256, build_model=build_tiny_model)
    bigger = resolve_mixed_precision("transformer", TINY, 40, 512, build_model=build_tiny_model)
    assert calls == [True, True, True] and other.mixed_precision == bigger.mixed_precision == "no"
    assert len(json.loads((cache_dir / "mixed_precision.json").read_text())) == 3
    # use_cache=False measures and stores nothing
    resolve_mixed_precision("transformer", TINY, 40, 256, build_model=build_tiny_model, use_cache=False)
    assert calls == [True] * 4 and len(json.loads((cache_dir / "mixed_precision.json").read_text())) == 3


def test_cpu_without_bf16_instructions_trains_float32_and_times_only_float32(cache_dir, monkeypatch):
    calls = []
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(precision, "measure_step_times", fake_timer(0.25, None, calls))
    choice = resolve_mixed_precision("transformer", TINY, 40, 256, build_model=build_tiny_model)
    assert choice.mixed_precision == "no" and calls == [False]
    assert choice.step_s == 0.25 and "no bf16 instructions" in choice.reason


def test_real_measurement_of_a_tiny_model_leaves_the_global_random_state_alone(cache_dir):
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    choice = resolve_mixed_precision("transformer", TINY, 40, 256, build_model=build_tiny_model)
    assert torch.equal(torch.rand(3), expected)  # the synthetic ids come from a private generator
    assert choice.mixed_precision in ("bf16", "no") and choice.float32_step_s > 0 and choice.bf16_step_s > 0
    assert choice.mixed_precision == (
        "bf16" if choice.float32_step_s / choice.bf16_step_s >= BF16_MIN_SPEEDUP else "no"
    )


def test_synthetic_batch_is_a_padded_token_budget_batch_with_shifted_labels():
    batch = synthetic_batch(vocab_size=50, max_tokens=400, length=40)
    assert batch["input_ids"].shape == (10, 40)
    mask, labels = batch["attention_mask"], batch["labels"]
    source_lengths, target_lengths = mask.sum(1), (labels != -100).sum(1)
    assert (
        source_lengths.max() == target_lengths.max() == 40 and source_lengths.min() >= 20 and target_lengths.min() >= 20
    )
    assert not mask.all() and torch.equal(
        mask[:, :-1] >= mask[:, 1:], torch.ones_like(mask[:, 1:], dtype=torch.bool)
    )  # right padding
    assert torch.equal(batch["input_ids"] == 0, mask == 0)  # padding id 0 exactly where the mask is 0
    real = labels[:, :-1] != -100
    assert torch.equal(batch["decoder_input_ids"][:, 1:][real], labels[:, :-1][real])
    assert int(batch["input_ids"][mask.bool()].min()) >= 4  # no special tokens


def test_train_config_accepts_auto():
    assert "auto" in CHOICES["mixed_precision"]
    validate_config(TrainConfig(max_steps=1, mixed_precision="auto"))
