"""modeling/losses.py: the one training loss of both families, against a float64 hand computation
of label-smoothed cross-entropy (Vaswani et al. 2017, §5.4) plus the coverage loss (See et al.
2017, eqs. 12-13), and against the trainer's formula (summed token loss + its coverage penalty,
divided by the update's target tokens)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from attention_seq2seq.modeling.cpu_fast_paths import label_smoothed_cross_entropy
from attention_seq2seq.modeling.losses import seq2seq_lm_loss, shift_tokens_right
from helpers import rnn_model, tiny_model

LABELS = torch.tensor([[3, 1, 4, 2], [0, 2, -100, -100]])


def hand_loss(logits, labels, epsilon, penalty=None, weight=0.0, count=None) -> float:
    """Σ_t [(1 − ε)(−log p(y_t)) + ε (−1/V Σ_v log p(v))] (+ λ Σ_t penalty_t) over labels ≠ -100,
    divided by `count` (default: the number of such labels), in Python floats."""
    total, kept = 0.0, 0
    for b in range(labels.size(0)):
        for t in range(labels.size(1)):
            y = int(labels[b, t])
            if y == -100:
                continue
            row = [float(x) for x in logits[b, t]]
            log_z = math.log(sum(math.exp(x) for x in row))
            log_p = [x - log_z for x in row]
            total += (1 - epsilon) * -log_p[y] + epsilon * -sum(log_p) / len(row)
            if penalty is not None:
                total += weight * float(penalty[b, t])
            kept += 1
    return total / (count if count is not None else kept)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("num_items_in_batch", [None, 9, torch.tensor(9)])
@pytest.mark.parametrize("epsilon, weight", [(0.0, None), (0.1, None), (0.1, 0.5)])
def test_loss_is_the_hand_computed_label_smoothed_cross_entropy_plus_coverage(
    fast, num_items_in_batch, epsilon, weight
):
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 5, dtype=torch.float64)
    penalty = torch.rand(2, 4, dtype=torch.float64) if weight else None
    config = SimpleNamespace(label_smoothing=epsilon, coverage_loss_weight=weight, use_cpu_fast_paths=fast)
    loss = seq2seq_lm_loss(logits, LABELS, config, num_items_in_batch, coverage_penalty=penalty)
    count = None if num_items_in_batch is None else 9
    expected = hand_loss(logits, LABELS, epsilon, penalty, weight or 0.0, count)
    assert loss.item() == pytest.approx(expected, rel=1e-12)


def test_loss_of_an_update_whose_labels_are_all_ignored_is_zero():
    config = SimpleNamespace(label_smoothing=0.1, coverage_loss_weight=None, use_cpu_fast_paths=True)
    labels = torch.full((2, 3), -100)
    for n in (None, 0, torch.tensor(0)):
        assert seq2seq_lm_loss(torch.randn(2, 3, 5), labels, config, n).item() == 0.0


def test_shift_tokens_right_is_one_function_for_both_families():
    from attention_seq2seq.modeling import modeling_rnn_seq2seq, modeling_transformer_seq2seq

    assert modeling_rnn_seq2seq.shift_tokens_right is shift_tokens_right
    assert modeling_transformer_seq2seq.shift_tokens_right is shift_tokens_right
    assert shift_tokens_right(LABELS, 0, 1).tolist() == [[1, 3, 1, 4], [1, 0, 2, 0]]


def _batch():
    input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    labels = torch.tensor([[11, 12, 13, 2], [14, 2, -100, -100]])
    return dict(input_ids=input_ids, attention_mask=(input_ids != 0).long(), labels=labels)


@pytest.mark.parametrize("family", ["rnn-coverage", "rnn", "transformer"])
@pytest.mark.parametrize("fast", [True, False])
def test_model_loss_with_num_items_in_batch_is_the_trainers_summed_loss_over_the_update_tokens(family, fast):
    """What training/train.py computes today for a micro-batch of an update of n target tokens:
    (token_loss_sum(logits, labels, ε) + coverage_loss_weight · Σ coverage_penalty[labels != -100]) / n,
    token_loss_sum being the fused label-smoothed cross-entropy summed over the kept tokens."""
    if family == "transformer":
        model = tiny_model(preset="small", label_smoothing=0.1, use_cpu_fast_paths=fast)
    else:
        variant = "bahdanau-lstm-coverage" if family == "rnn-coverage" else "luong-general-feed-gru"
        model = rnn_model(
            variant,
            label_smoothing=0.1,
            dropout=0.0,
            use_cpu_fast_paths=fast,
            **({"coverage_loss_weight": 0.5} if family == "rnn-coverage" else {}),
        )
    batch, n = _batch(), 13  # 6 target tokens here, 13 in the whole update
    out = model.train()(**batch, num_items_in_batch=n)
    labels = batch["labels"]
    trainer_sum = label_smoothed_cross_entropy(out.logits.flatten(0, 1), labels.flatten(), 0.1, reduction="sum")
    coverage = getattr(out, "coverage_penalty", None)
    if family == "rnn-coverage":
        assert coverage is not None
        trainer_sum = trainer_sum + 0.5 * coverage[labels != -100].sum()
    torch.testing.assert_close(out.loss, trainer_sum / n, rtol=1e-6, atol=1e-7)
    hand = hand_loss(
        out.logits.detach().double(),
        labels,
        0.1,
        coverage.detach().double() if coverage is not None else None,
        0.5,
        count=n,
    )
    assert out.loss.item() == pytest.approx(hand, rel=1e-5)
    # None: this batch's own token count
    torch.testing.assert_close(model(**batch).loss, out.loss * n / 6, rtol=1e-6, atol=1e-7)
