"""Labels in, training loss out: one definition for both model families.

- `shift_tokens_right`: the teacher-forcing decoder inputs of a label batch.
- `token_loss_sum`: the summed label-smoothed cross-entropy (Vaswani et al. 2017, §5.4), the
  reference (`F.cross_entropy`) of the fused loss in cpu_fast_paths.py.
- `seq2seq_lm_loss`: what `model(..., labels=..., num_items_in_batch=n).loss` returns for the
  Transformer and the RNN: (Σ token losses [+ λ Σ coverage penalties]) / n.

Imports only torch and a flat sibling: shipped to the Hub next to the modeling files.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .cpu_fast_paths import fast_paths


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs from labels: [<s>, y_1, ..., y_{n-1}], -100 replaced by padding.

    Args:
        labels: (batch, tgt_len) target ids, -100 where the loss ignores a position.
        pad_token_id: id written where `labels` holds -100.
        decoder_start_token_id: the first decoder input (`<s>`, id 1 in this package).

    Returns:
        (batch, tgt_len) `decoder_input_ids`.
    """
    decoder_input_ids = labels.new_empty(labels.shape)
    decoder_input_ids[:, 1:] = labels[:, :-1]
    decoder_input_ids[:, 0] = decoder_start_token_id
    return decoder_input_ids.masked_fill_(decoder_input_ids == -100, pad_token_id)


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Σ over positions whose label is not -100 of (1 − ε)·(−log p(y)) + ε·(−(1/V) Σ_v log p(v)):
    cross-entropy with label smoothing ε_ls (Vaswani et al. 2017, §5.4; Szegedy et al. 2016, §7).

    Args:
        logits: (tokens, vocab_size); half precision is upcast to float32 for the softmax.
        labels: (tokens,) target ids, -100 where a position does not count.
        epsilon: ε_ls, in [0, 1).

    Returns:
        A float32 (float64 for float64 logits) scalar; 0 when every label is -100.
    """
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)  # half → float32
    return F.cross_entropy(
        logits.to(compute_dtype), labels, ignore_index=-100, label_smoothing=epsilon, reduction="sum"
    )


def _divisor(num_items_in_batch: int | torch.Tensor | None, labels: torch.Tensor, like: torch.Tensor):
    """The loss's normaliser: `num_items_in_batch`, or this batch's count of labels that are not
    -100; at least 1 (an update whose labels are all -100 has a zero loss, not NaN)."""
    if num_items_in_batch is None:
        return (labels != -100).sum().clamp(min=1)
    if torch.is_tensor(num_items_in_batch):
        return num_items_in_batch.to(like.device).clamp(min=1)
    return max(int(num_items_in_batch), 1)


def seq2seq_lm_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    config,
    num_items_in_batch: int | torch.Tensor | None = None,
    coverage_penalty: torch.Tensor | None = None,
    label_smoothing: float | None = None,
) -> torch.Tensor:
    """The training loss of both model families:

        loss = (Σ_t CE_ls(logits_t, y_t) + λ Σ_t Σ_i min(a_i^t, c_i^t)) / n

    over target positions t whose label is not -100: the label-smoothed cross-entropy
    (`token_loss_sum`, ε = `config.label_smoothing`) plus, for an RNN with coverage, λ =
    `config.coverage_loss_weight` times the coverage penalty (See et al. 2017, eqs. 12-13).

    Args:
        logits: (batch, tgt_len, vocab_size).
        labels: (batch, tgt_len), -100 on padding.
        config: the model config (`label_smoothing`, `coverage_loss_weight`, `use_cpu_fast_paths`).
        num_items_in_batch: n, the number of labels that are not -100 in the whole update (every
            micro-batch of a gradient accumulation, every process), as transformers' Trainer passes
            it (its loss-kwargs contract); accumulated micro-batches then add up to the full
            batch's mean. None: this batch's own count.
        coverage_penalty: (batch, tgt_len) Σ_i min(a_i^t, c_i^t), or None.
        label_smoothing: ε instead of `config.label_smoothing` (the trainer passes its run's ε; its
            validation loss passes 0).

    Returns:
        A float32 scalar (float64 for float64 logits).
    """
    fast = fast_paths(config)
    loss_sum = fast.token_loss_sum if fast else token_loss_sum
    epsilon = config.label_smoothing if label_smoothing is None else label_smoothing
    total = loss_sum(logits.flatten(0, 1), labels.flatten(), epsilon)
    weight = getattr(config, "coverage_loss_weight", 0.0)
    if coverage_penalty is not None and weight:
        total = total + weight * coverage_penalty.masked_select(labels != -100).sum()
    return total / _divisor(num_items_in_batch, labels, total)


__all__ = ["seq2seq_lm_loss", "shift_tokens_right", "token_loss_sum"]
