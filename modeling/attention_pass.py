"""The teacher-forced attention pass: the one way this package reads a translation's attention.

Attention weights are read back after decoding, not during it: take a target (the model's own
translation from ``generate``, cut after its ``</s>``, or a given reference), feed it to the
decoder in one forward pass with ``output_attentions=True`` (teacher forcing), and keep, per
sentence, the weights of the real positions. Row ``t`` of every target-side array is the step
that predicts ``target_ids[t]``; the decoder read ``decoder_input_ids[t]`` there (the start token,
then ``target_ids[:-1]``). The weights are those decoding used: with and without a cache the
models agree (tests/test_*_seq2seq.py).

Three levels, each built on the one below:

- :func:`attention_pass`: sources (strings) and optional references (strings) to one
  :class:`SentenceAttention` per sentence; without references it runs ``generate`` first. The
  plot-attention command (attention/forced.py), training's heat-maps (training/evaluation.py),
  word alignments (attention/alignment.py) and the attention explorer (attention/explorer.py)
  call it.
- :func:`force_sequences`: the teacher-forced forward over sequences ``generate`` returned (start
  token first, padded after ``</s>``); the shipped translation pipeline's ``return_attention``
  (pipeline_translation.py) calls it on its own ``generate`` output.
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


# ---------------------------------------------------------------------------------------------
# Per sentence


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
