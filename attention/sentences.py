"""The attention of whole sentences: tokenize, translate, teacher-force, slice per sentence.

:func:`attention_pass` turns source strings (and optional reference strings) into one
:class:`SentenceAttention` per sentence, through the teacher-forced pass of
``modeling/attention_pass.py`` (:func:`force_sequences` over ``generate``'s output, or
:func:`force_targets` over the references). The plot-attention command (attention/forced.py),
training's heat-maps (training/evaluation.py), word alignments (attention/alignment.py) and the
attention explorer (attention/explorer.py) call it.

Shipped in the explorer's Space (hub/space.py): imports only torch, transformers and the
attention pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
from transformers.utils import ModelOutput

from ..modeling.attention_pass import ForcedBatch, eager_attention, force_sequences, force_targets


@dataclass
class SentenceAttention:
    """The attention of one sentence pair, on its real positions (no padding).

    The arrays are tensors on the model's device, per decoder (or encoder) layer; the RNN gives
    one cross-attention layer with one head.

    Attributes:
        source_ids: (src_len,) the source pieces, ``</s>`` included.
        target_ids: (tgt_len,) the target pieces, ``</s>`` last when the translation ended.
        decoder_input_ids: (tgt_len,) what the decoder read: the start token, then
            ``target_ids[:-1]``.
        source_tokens, target_tokens, decoder_tokens: those ids as the tokenizer's pieces.
        cross: per layer (num_heads, tgt_len, src_len); None for a model without attention.
        encoder_self: per layer (num_heads, src_len, src_len), with ``self_attention=True`` and
            a model that has it (the Transformer), else None.
        decoder_self: per layer (num_heads, tgt_len, tgt_len), likewise.
        logits: (tgt_len, vocab_size) the next-token logits of each step.
        source_offsets, target_offsets: each piece's (start, end) characters in its text, with
            ``offsets=True`` (None otherwise, and for generated targets).
    """

    source_ids: list[int]
    target_ids: list[int]
    decoder_input_ids: list[int]
    source_tokens: list[str]
    target_tokens: list[str]
    decoder_tokens: list[str]
    cross: tuple[torch.Tensor, ...] | None
    encoder_self: tuple[torch.Tensor, ...] | None
    decoder_self: tuple[torch.Tensor, ...] | None
    logits: torch.Tensor
    source_offsets: list[tuple[int, int]] | None = None
    target_offsets: list[tuple[int, int]] | None = None


@dataclass
class AttentionPass:
    """What :func:`attention_pass` computed.

    Attributes:
        sentences: one :class:`SentenceAttention` per source, in order.
        generated: ``generate``'s return value (a tensor of sequences, or its ``ModelOutput``
            with ``return_dict_in_generate=True``), None when references were given.
        forced: the batched forward (:class:`ForcedBatch`).
    """

    sentences: list[SentenceAttention]
    generated: torch.Tensor | ModelOutput | None
    forced: ForcedBatch


def attention_pass(
    model,
    tokenizer,
    sources: Sequence[str],
    references: Sequence[str] | None = None,
    *,
    generate_kwargs: dict | None = None,
    max_source_length: int | None = None,
    offsets: bool = False,
    self_attention: bool = False,
    forward_context=None,
    device=None,
) -> AttentionPass:
    """The attention of each source's translation (or of its reference), by one teacher-forced
    forward pass over the batch.

    Without ``references`` the sources are translated first (``model.generate(input_ids,
    attention_mask, **generate_kwargs)``, in eager attention too, so the translation is the one
    whose weights are shown); each sentence's target is its first returned sequence (the best beam
    with ``num_return_sequences``), without the start token and cut after ``</s>``. References are
    tokenized as targets (``text_target``), ``</s>`` included.

    Args:
        model: an encoder-decoder of this package (installed or remote code); switched to eager
            attention for the call only (:func:`eager_attention`).
        tokenizer: its tokenizer.
        sources: the source sentences (one batch, padded to the longest).
        references: one target sentence per source to teacher-force instead of translating.
        generate_kwargs: ``generate`` options (``num_beams``, ``max_new_tokens``, ...).
        max_source_length: truncate the sources to this many pieces (default: no truncation).
        offsets: also return each piece's character offsets (needs a fast tokenizer).
        self_attention: also return the encoder and decoder self-attention.
        forward_context: a context manager entered around the teacher-forced forward only.
        device: where the inputs go (default: the device of the model's parameters).

    Returns:
        an :class:`AttentionPass`.

    Raises:
        ValueError: ``references`` does not have one sentence per source, or ``sources`` is empty.
    """
    if not sources:
        raise ValueError("attention_pass: no source sentences")
    if references is not None and len(references) != len(sources):
        raise ValueError(f"attention_pass: {len(sources)} sources but {len(references)} references")
    if device is None:
        device = next(model.parameters()).device
    encoded = tokenizer(
        list(sources),
        padding=True,
        truncation=max_source_length is not None,
        max_length=max_source_length,
        return_offsets_mapping=offsets,
        return_tensors="pt",
    )
    input_ids = encoded["input_ids"].to(device)  # (batch, src_len)
    attention_mask = encoded["attention_mask"].to(device)  # (batch, src_len)
    generated, target_offsets = None, None
    with eager_attention(model), torch.no_grad():
        if references is None:
            generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, **(generate_kwargs or {}))
            sequences = generated.sequences if isinstance(generated, ModelOutput) else generated
            per_source = sequences.shape[0] // len(sources)
            forced = force_sequences(
                model, input_ids, attention_mask, sequences[::per_source], forward_context=forward_context
            )
            if forced is None:
                raise ValueError("attention_pass: generate returned no target token; there is no attention to read")
        else:
            labels = tokenizer(
                text_target=list(references), padding=True, return_offsets_mapping=offsets, return_tensors="pt"
            )
            masks = labels["attention_mask"].bool()  # (batch, tgt_len)
            targets = [row[mask].tolist() for row, mask in zip(labels["input_ids"], masks)]
            if offsets:
                target_offsets = [
                    [tuple(pair) for pair in row[mask].tolist()] for row, mask in zip(labels["offset_mapping"], masks)
                ]
            start = model.config.decoder_start_token_id  # what the models' labels shift puts first
            forced = force_targets(
                model, input_ids, attention_mask, targets, [start] * len(targets), forward_context=forward_context
            )
    sentences = []
    for b in range(len(sources)):
        real = attention_mask[b].bool()  # (src_len,) the source's own pieces
        target_ids = forced.targets[b]
        tgt_len = len(target_ids)
        source_ids = input_ids[b][real].tolist()
        decoder_ids = forced.decoder_input_ids[b, :tgt_len].tolist()
        outputs = forced.outputs
        sentences.append(
            SentenceAttention(
                source_ids=source_ids,
                target_ids=target_ids,
                decoder_input_ids=decoder_ids,
                source_tokens=tokenizer.convert_ids_to_tokens(source_ids),
                target_tokens=tokenizer.convert_ids_to_tokens(target_ids),
                decoder_tokens=tokenizer.convert_ids_to_tokens(decoder_ids),
                cross=_per_layer(outputs.cross_attentions, b, tgt_len, real),
                encoder_self=_per_layer(getattr(outputs, "encoder_attentions", None), b, real, real)
                if self_attention
                else None,
                decoder_self=_per_layer(getattr(outputs, "decoder_attentions", None), b, tgt_len, tgt_len)
                if self_attention
                else None,
                logits=outputs.logits[b, :tgt_len],
                source_offsets=[tuple(pair) for pair in encoded["offset_mapping"][b][real.cpu()].tolist()]
                if offsets
                else None,
                target_offsets=target_offsets[b] if target_offsets is not None else None,
            )
        )
    return AttentionPass(sentences, generated, forced)


def _per_layer(layers, b: int, rows, columns) -> tuple[torch.Tensor, ...] | None:
    """Sentence ``b`` of per-layer (batch, num_heads, queries, keys) weights, on its real queries
    and keys: ``rows`` / ``columns`` are a length (the first positions) or a boolean mask."""
    if not layers or layers[0] is None:
        return None

    def pick(length_or_mask):
        return slice(None, length_or_mask) if isinstance(length_or_mask, int) else length_or_mask

    return tuple(layer[b][:, pick(rows)][:, :, pick(columns)] for layer in layers)
