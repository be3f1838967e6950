"""The teacher-forced attention pass: the one way this package reads a translation's attention.

Attention weights are read back after decoding, not during it: take a target (the model's own
translation from ``generate``, cut after its ``</s>``, or a given reference), feed it to the
decoder in one forward pass with ``output_attentions=True`` (teacher forcing), and keep, per
sentence, the weights of the real positions. Row ``t`` of every target-side array is the step
that predicts ``target_ids[t]``; the decoder read ``decoder_input_ids[t]`` there (the start token,
then ``target_ids[:-1]``). The weights are those decoding used: with and without a cache the
models agree (tests/test_*_seq2seq.py).

- :func:`force_sequences`: the teacher-forced forward over sequences ``generate`` returned (start
  token first, padded after ``</s>``); the shipped translation pipeline's ``return_attention``
  (pipeline_translation.py) and the sentence-level pass (``attention/sentences.py``: tokenize,
  generate, slice per sentence) call it.
- :func:`force_targets`: the forward itself, over target ids, under :func:`eager_attention`.

SDPA never materialises the attention probabilities, so the model runs in eager attention for
the pass and is switched back after (:func:`eager_attention`); nothing else about the model
changes (its training/evaluation mode is the caller's).

Shipped to the Hub next to the pipeline (a flat sibling: ``from .attention_pass import ...``) and
copied into the explorer's Space (hub/space.py): imports only torch, transformers and
``generation_lengths``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.utils import ModelOutput

from .generation_lengths import eos_token_ids


@contextlib.contextmanager
def eager_attention(model):
    """Run the block with ``model`` in eager attention, then restore its previous implementation.

    A model already in eager attention, one without an ``_attn_implementation`` (the RNN) or
    without ``set_attn_implementation`` is left alone. The previous implementation is restored
    however the block ends (an exception included).
    """
    previous = getattr(model.config, "_attn_implementation", None)
    switch = previous not in (None, "eager") and hasattr(model, "set_attn_implementation")
    if switch:
        model.set_attn_implementation("eager")
    try:
        yield
    finally:
        if switch:
            model.set_attn_implementation(previous)


def target_length(ids: Sequence[int], eos_ids: set[int], pad_token_id: int | None = None) -> int:
    """Length of a generated target (start token removed): up to and including the first id of
    ``eos_ids``; with ``pad_token_id``, a row that reaches that id first ends before it (the
    padding ``generate`` adds after a finished sequence); else all of ``ids``."""
    for position, token in enumerate(ids):
        if token in eos_ids:
            return position + 1
        if pad_token_id is not None and token == pad_token_id:
            return position
    return len(ids)


# ---------------------------------------------------------------------------------------------
# The forward pass


@dataclass
class ForcedBatch:
    """A teacher-forced forward over a batch, in eager attention.

    Attributes:
        outputs: the model's output (``return_dict=True``): ``logits`` (batch, tgt_len, vocab),
            ``cross_attentions`` (one (batch, num_heads, tgt_len, src_len) tensor per decoder
            layer; the RNN gives one layer with one head, or None without attention) and, for the
            Transformer, ``encoder_attentions`` (batch, num_heads, src_len, src_len) and
            ``decoder_attentions`` (batch, num_heads, tgt_len, tgt_len) per layer.
        decoder_input_ids: (batch, tgt_len) what the decoder read: each row's start token, then
            its target but the last id, then padding.
        targets: each row's target ids (no start token), as teacher-forced; positions of a row
            past its length are padding (causality keeps them out of the real rows).
    """

    outputs: ModelOutput
    decoder_input_ids: torch.Tensor
    targets: list[list[int]]


def force_targets(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    targets: Sequence[Sequence[int]],
    start_ids: Sequence[int],
    pad_token_id: int | None = None,
    forward_context=None,
) -> ForcedBatch:
    """Teacher-force ``targets`` with ``output_attentions=True``, in eager attention.

    Args:
        model: an encoder-decoder (this package's, installed or remote code).
        input_ids, attention_mask: (batch, src_len) the sources.
        targets: per row the target ids (no start token; ``</s>`` last when it has one), at least
            one row non-empty.
        start_ids: per row the decoder start token.
        pad_token_id: fills the rows shorter than the longest (default: the model config's; 0
            without one). Padding is never read back: the decoder is causal.
        forward_context: a context manager entered around the forward pass only (the explorer
            records local attention's aligned positions with a forward hook there).

    Returns:
        a :class:`ForcedBatch`; row b of ``decoder_input_ids`` is ``[start_ids[b], *targets[b]]``
        padded, without its last position: the labels ``targets`` shifted right, as the models do
        with ``labels``.

    Raises:
        ValueError: every target is empty (there is nothing to read), or the counts differ.
    """
    if len(targets) != len(start_ids) or len(targets) != input_ids.shape[0]:
        raise ValueError(
            f"force_targets: {input_ids.shape[0]} sources, {len(targets)} targets and {len(start_ids)} start ids"
        )
    width = max((len(target) for target in targets), default=0)
    if width == 0:
        raise ValueError("force_targets: every target is empty; there is no attention to read")
    if pad_token_id is None:
        pad_token_id = getattr(model.config, "pad_token_id", None)
    pad = 0 if pad_token_id is None else pad_token_id
    rows = []
    for start, target in zip(start_ids, targets):
        padded = [int(t) for t in target] + [pad] * (width - len(target))  # the labels, padded
        rows.append([int(start)] + padded[:-1])  # shifted right behind the start token
    decoder_input_ids = torch.tensor(rows, dtype=torch.long, device=input_ids.device)  # (batch, tgt_len)
    with eager_attention(model), torch.no_grad(), forward_context or contextlib.nullcontext():
        outputs = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            output_attentions=True,
            use_cache=False,
            return_dict=True,
        )
    return ForcedBatch(outputs, decoder_input_ids, [[int(t) for t in target] for target in targets])


def force_sequences(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    sequences: torch.Tensor,
    pad_token_id: int | None = None,
    forward_context=None,
) -> ForcedBatch | None:
    """Teacher-force what ``generate`` returned: each row of ``sequences`` (batch, out_len) is its
    decoder start token, then the translation, cut after the first ``</s>``
    (``generation_config.eos_token_id``, :func:`~generation_lengths.eos_token_ids`) and, with
    ``pad_token_id``, before a ``pad_token_id`` met first (:func:`target_length`).

    ``input_ids`` / ``attention_mask`` are (batch, src_len), one row per row of ``sequences`` (repeat
    a source for each of its returned sequences). Returns None when no row has a token after its
    start token (nothing to read).
    """
    eos_ids = eos_token_ids(model.generation_config)
    rows = sequences.tolist()
    targets = [row[1:][: target_length(row[1:], eos_ids, pad_token_id)] for row in rows]
    if not any(targets):
        return None
    return force_targets(
        model, input_ids, attention_mask, targets, [row[0] for row in rows], forward_context=forward_context
    )
