"""How long `generate()` may run, shared by both model families.

transformers lets a `max_new_tokens` from the model's `generation_config` (ours: 128) take
precedence over a `max_length` the caller passes to `generate()`; here the caller's explicit length
wins. A model with a position table (the Transformer's `max_position_embeddings`) also caps its
default length at what the table can represent and refuses, before decoding, an explicit request
that would run past it.

`eos_token_ids` reads the set of end-of-sentence ids from a generation config, the one spelling
of that set for every caller.

Decoding itself is transformers' own loop: nothing here overrides a private member of
`GenerationMixin` other than the two length hooks below, so the remote-code export runs under
whatever transformers a Hub user has.

Shipped to the Hub next to the modeling files (a flat sibling: ``from .generation_lengths import
...``); imports only transformers.
"""

from __future__ import annotations

from transformers import GenerationConfig, GenerationMixin

# Set on generate()'s own copy of the generation config: True when the caller chose the length
# (max_length or max_new_tokens, as an argument or in a `generation_config` passed to generate()).
_CALLER_SET_LENGTH = "_caller_set_length"


class Seq2SeqGenerationMixin(GenerationMixin):
    """`GenerationMixin` where the caller's `max_length` beats the model's default `max_new_tokens`.

    With `_max_decoder_positions()` returning a number N, the default length is capped so that
    the decoder sequence (start token included) has at most N tokens, and an explicit request past
    N + 1 tokens (the last generated token is never fed back, so N + 1 still decodes) raises
    `ValueError` naming both numbers.
    """

    def _max_decoder_positions(self) -> int | None:
        """The decoder's position limit, or None when it has none (an RNN)."""
        return None

    def _prepare_generation_config(self, generation_config: GenerationConfig | None, **kwargs):
        max_length = kwargs.get("max_length")
        max_new_tokens = kwargs.get("max_new_tokens")
        if generation_config is not None:
            max_length = generation_config.max_length if max_length is None else max_length
            max_new_tokens = generation_config.max_new_tokens if max_new_tokens is None else max_new_tokens
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        if max_length is not None and max_new_tokens is None:
            # The caller asked for a total length; the model's default max_new_tokens would win.
            generation_config.max_new_tokens = None
        setattr(generation_config, _CALLER_SET_LENGTH, max_length is not None or max_new_tokens is not None)
        return generation_config, model_kwargs

    def _prepare_generated_length(self, generation_config, *args, input_ids_length, **kwargs):
        generation_config = super()._prepare_generated_length(
            generation_config, *args, input_ids_length=input_ids_length, **kwargs
        )
        limit = self._max_decoder_positions()
        if limit is None or generation_config.max_length is None:
            return generation_config
        if getattr(generation_config, _CALLER_SET_LENGTH, False):
            if generation_config.max_length > limit + 1:
                asked = (
                    f"max_new_tokens={generation_config.max_new_tokens} after {input_ids_length} decoder token(s)"
                    if generation_config.max_new_tokens is not None
                    else f"max_length={generation_config.max_length}"
                )
                raise ValueError(
                    f"generate() was asked for up to {generation_config.max_length} decoder tokens ({asked}), "
                    f"but max_position_embeddings={limit} lets the decoder read at most {limit} positions "
                    f"(sequences of {limit + 1} tokens); ask for fewer tokens"
                )
        elif generation_config.max_length > limit:
            generation_config.max_length = limit
            if generation_config.max_new_tokens is not None:
                generation_config.max_new_tokens = max(limit - input_ids_length, 0)
        return generation_config


def eos_token_ids(generation_config) -> set[int]:
    """The ids that end a generated sequence: ``generation_config.eos_token_id`` as a set.

    ``eos_token_id`` may be one id, a list or tuple of ids, a tensor of them, or None (no end token:
    the empty set). Used wherever a generated sequence is cut after its end (the attention pass,
    ``attention_pass.py``; file translation).
    """
    eos = getattr(generation_config, "eos_token_id", None)
    if hasattr(eos, "tolist"):  # a tensor, as generate() keeps it on its own copy of the config
        eos = eos.tolist()
    if eos is None:
        return set()
    if isinstance(eos, (list, tuple, set)):
        return {int(token) for token in eos}
    return {int(eos)}


__all__ = ["Seq2SeqGenerationMixin", "eos_token_ids"]
