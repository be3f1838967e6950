"""The training objectives: what one optimizer update minimises.

- :func:`token_loss_sum`: the models' own loss (label-smoothed cross-entropy, Szegedy et al. 2016,
  plus an RNN's coverage penalty; `modeling/losses.py`) summed over the target tokens; the update
  divides it by the global token count (fairseq's recipe).
- :func:`source_word_dropout`: word dropout on the source (Sennrich & Zhang 2019).
- :func:`symmetric_kl_sum`: the R-Drop regulariser (Liang et al. 2021, eq. 2-3).
- :func:`optimizer_update`: one update over a rank's micro-batches, normalised by the target
  tokens of the whole update on all ranks.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from ..modeling.losses import seq2seq_lm_loss


def token_loss_sum(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float,
    model_config=None,
    coverage_penalty: torch.Tensor | None = None,
) -> torch.Tensor:
    """The models' own loss (`modeling/losses.py`, `seq2seq_lm_loss`) *summed* over the target
    tokens (labels != -100), with the run's label smoothing: n = 1 instead of the token count.

    Args:
        logits: (batch, tgt_len, vocab_size).
        labels: (batch, tgt_len), -100 on padding.
        label_smoothing: epsilon; the smoothing mass is spread over the whole vocabulary.
        model_config: the model's config: its coverage weight and `use_cpu_fast_paths` (on a CPU
            the fused one-pass loss, `cpu_fast_paths.label_smoothed_cross_entropy`). None: no
            coverage, fast paths on.
        coverage_penalty: (batch, tgt_len), an RNN with coverage's Σ_i min(a_i^t, c_i^t), or None.

    Returns:
        A scalar tensor (float32). Divide by the token count of the *whole* update yourself.
    """
    return seq2seq_lm_loss(
        logits,
        labels,
        model_config if model_config is not None else _PLAIN_LOSS_CONFIG,
        num_items_in_batch=1,
        coverage_penalty=coverage_penalty,
        label_smoothing=label_smoothing,
    )


# What `token_loss_sum` reads of a model config when it has none: no coverage, fast paths on.
_PLAIN_LOSS_CONFIG = SimpleNamespace(label_smoothing=0.0, coverage_loss_weight=0.0, use_cpu_fast_paths=True)


def source_word_dropout(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, p: float, unk_token_id: int, keep_ids: tuple[int, ...] = ()
) -> torch.Tensor:
    """Word dropout on the source: each real source token becomes ``unk_token_id`` with probability p.

    Sennrich & Zhang 2019 (Revisiting Low-Resource Neural Machine Translation) drop whole words
    to regularise small-data NMT, after Gal & Ghahramani 2016's word-embedding dropout; here the
    unit is the subword and a dropped one reads as ``<unk>`` (one learned "missing" vector, the
    same for both model families). Padding (``attention_mask`` 0) and ``keep_ids`` (``</s>``)
    are never dropped. The draw uses torch's global generator, so a seeded run repeats it and a
    resumed one continues it.

    Args:
        input_ids: (batch, src_len) source token ids.
        attention_mask: (batch, src_len), 1 on real tokens, 0 on padding.
        p: drop probability in [0, 1).
        unk_token_id: the id that replaces a dropped token.
        keep_ids: ids never dropped.

    Returns:
        A new (batch, src_len) tensor; ``input_ids`` is not modified. p = 0 returns ``input_ids`` itself.
    """
    if p == 0.0:
        return input_ids
    drop = (torch.rand(input_ids.shape, device=input_ids.device) < p) & attention_mask.bool()
    for token_id in keep_ids:
        drop &= input_ids != token_id
    return input_ids.masked_fill(drop, unk_token_id)


def symmetric_kl_sum(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) + KL(q || p) summed over positions: twice the R-Drop regulariser L_KL of
    Liang et al. 2021, eq. 2 (eq. 3 adds alpha x L_KL to both passes' NLL), computed as the single
    sum  Σ_v (p_v − q_v)(log p_v − log q_v)  per position.

    Args:
        logits_p, logits_q: (tokens, vocab_size) logits of the same positions from two forward
            passes; half-precision logits are upcast to float32. Gradients reach both.

    Returns:
        A float32 scalar (0 for zero positions).
    """
    log_p = torch.log_softmax(logits_p.float(), dim=-1)
    log_q = torch.log_softmax(logits_q.float(), dim=-1)
    return ((log_p.exp() - log_q.exp()) * (log_p - log_q)).sum()


def optimizer_update(
    accelerator,
    model,
    optimizer,
    scheduler,
    micro: list[dict],
    label_smoothing: float,
    max_grad_norm: float,
    rdrop_alpha: float = 0.0,
):
    """One optimizer update over this rank's micro-batches, normalised by the global token count.

    Args:
        micro: this rank's micro-batches (dicts with ``input_ids``, ``attention_mask``,
            ``decoder_input_ids``, ``labels``), all already on the device.
        label_smoothing: epsilon of the training loss.
        max_grad_norm: clip the global gradient norm to this (0: no clipping).
        rdrop_alpha: R-Drop weight (0: off). Each micro-batch then runs as two copies in one
            forward pass (different dropout masks); the loss is both copies' cross-entropy plus
            ``rdrop_alpha / 2`` x `symmetric_kl_sum` of their predictions, and the update is
            normalised by the tokens of both copies.

    Returns:
        ``(loss_sum, num_tokens)``: this rank's summed smoothed cross-entropy (a detached scalar
        tensor; with R-Drop over both copies, without the KL term) and the target tokens of the
        whole update over all ranks (a scalar tensor; with R-Drop both copies count). Nothing is
        synchronised to the host.
    """
    world = accelerator.num_processes
    copies = 2 if rdrop_alpha > 0 else 1
    num_tokens = copies * sum((mb["labels"] != -100).sum() for mb in micro)
    if world > 1:
        num_tokens = accelerator.reduce(num_tokens, reduction="sum")
    update_loss = torch.zeros((), device=accelerator.device)
    model_config = accelerator.unwrap_model(model).config
    for i, mb in enumerate(micro):
        sync = i == len(micro) - 1  # DDP all-reduces the gradients on the last micro-batch only
        with contextlib.nullcontext() if sync else accelerator.no_sync(model):
            if copies == 2:
                mb = {k: torch.cat([v, v]) for k, v in mb.items()}
            out = model(
                input_ids=mb["input_ids"],
                attention_mask=mb["attention_mask"],
                decoder_input_ids=mb["decoder_input_ids"],
                use_cache=False,
            )
            # The models' own loss (with an RNN's coverage penalty, See et al. 2017, eq. 12), summed.
            loss_sum = token_loss_sum(
                out.logits, mb["labels"], label_smoothing, model_config, getattr(out, "coverage_penalty", None)
            )
            objective = loss_sum
            if copies == 2:
                first, second = out.logits.chunk(2)
                keep = mb["labels"].chunk(2)[0] != -100
                objective = loss_sum + 0.5 * rdrop_alpha * symmetric_kl_sum(first[keep], second[keep])
            # DDP averages gradients over ranks; scaling by the world size turns that average into
            # a sum, so the update is d(summed loss)/d(weights) / (global target tokens).
            accelerator.backward(objective * (world / num_tokens))
        update_loss += loss_sum.detach()
    if max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    if not accelerator.optimizer_step_was_skipped:  # an fp16 overflow skips the step: keep the schedule
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return update_loss, num_tokens
