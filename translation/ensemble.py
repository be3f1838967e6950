"""Ensembles: several translation models decoding as one, through transformers' own ``generate``.

At every decoding step each member m scores the next token on its own, with its own encoder
output and its own cache (a Transformer's key/value cache, an RNN's recurrent state), and the
ensemble's score is the weighted mean of the members' log-probabilities:

    log p_ens(y_t | y_<t, x) ∝ Σ_m w_m · log p_m(y_t | y_<t, x),     Σ_m w_m = 1

(a product of experts, renormalised by ``generate``'s own log-softmax; fairseq's ``--path a:b``
and Marian's ``--models`` combine members per step in the same way, Marian also with weights).
Because the ensemble is a ``GenerationMixin`` model, every generation option works unchanged:
greedy, beam search (each member's cache is reordered with the beams), ``num_return_sequences``,
sampling, length penalty, ``no_repeat_ngram_size``, logits processors.

Members may be of different families (an RNN with a Transformer) as long as they share the
vocabulary and the special tokens; :class:`EnsembleForConditionalGeneration` refuses others in one
line naming both. The members' own ``prepare_inputs_for_generation`` decides what each is fed
(the whole prefix without a cache, else the tokens its cache has not consumed), so the ensemble
knows nothing of the families' internals.

This module is not shipped to the Hub; it is built from loaded models
(``EnsembleForConditionalGeneration([model_a, model_b], weights=[0.5, 0.5])``) or by
``attention-seq2seq translate -m A -m B``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from ..modeling.generation_lengths import Seq2SeqGenerationMixin

# What the members must agree on for their token ids to mean the same thing.
_SHARED_TOKEN_FIELDS = ("vocab_size", "pad_token_id", "eos_token_id", "decoder_start_token_id", "bos_token_id")


class EnsembleConfig(PreTrainedConfig):
    """The ensemble's own config: the members' shared special tokens and the weights."""

    model_type = "attention_seq2seq_ensemble"

    def __init__(self, weights: Sequence[float] | None = None, max_position_embeddings: int | None = None, **kwargs):
        kwargs.setdefault("is_encoder_decoder", True)
        self.weights = list(weights) if weights is not None else None
        self.max_position_embeddings = max_position_embeddings
        super().__init__(**kwargs)


@dataclass
class EnsembleEncoderOutput(ModelOutput):
    """Every member's encoder output; ``last_hidden_state`` is the first member's (for code in
    ``generate`` that reads the batch size from it)."""

    last_hidden_state: torch.Tensor | None = None
    members: tuple | None = None
    # Each member's source attention mask after expansion for beams: a family may keep one copy
    # per source (our Transformer) or repeat it per beam (transformers' default).
    attention_masks: tuple | None = None


class EnsembleCache:
    """The members' caches side by side; beam search reorders each with the same beam indices
    (:meth:`EnsembleForConditionalGeneration._reorder_cache`).

    ``members[m]`` is whatever member m's forward returned as its ``cache`` (None before its
    first step)."""

    is_compileable = False
    # generate must not slice the inputs by one cache length: each member's own
    # prepare_inputs_for_generation slices for its own cache.
    is_linear = (True,)

    def __init__(self, members: Sequence):
        self.members = list(members)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        for cache in self.members:
            if cache is not None:
                return cache.get_seq_length()
        return 0

    def __repr__(self) -> str:
        return f"EnsembleCache({', '.join(type(c).__name__ for c in self.members)})"


@dataclass
class EnsembleOutput(ModelOutput):
    """``logits``: (batch, tgt_len, vocab_size), the weighted mean of the members' log-probabilities
    (float32); ``cache``: the :class:`EnsembleCache` for the next step."""

    logits: torch.Tensor | None = None
    cache: EnsembleCache | None = None


def check_same_vocabulary(configs: Sequence, names: Sequence[str]) -> None:
    """Raise ValueError naming the first member whose vocabulary or special tokens differ from the
    first member's (``names`` say how to call them: paths, or "member 1")."""
    first = configs[0]
    for config, name in zip(configs[1:], names[1:]):
        for field in _SHARED_TOKEN_FIELDS:
            a, b = getattr(first, field, None), getattr(config, field, None)
            if a != b:
                raise ValueError(
                    f"ensemble members must share one vocabulary: {names[0]} has {field}={a}, {name} has {field}={b}"
                )


class EnsembleForConditionalGeneration(PreTrainedModel, Seq2SeqGenerationMixin):
    """Decode with several seq2seq models at once (see the module docstring for the equation).

    Args:
        members: loaded ``...ForConditionalGeneration`` models (either family, or any transformers
            encoder-decoder whose cache has ``reorder_cache``) sharing one vocabulary.
        weights: one non-negative weight per member (normalised to sum 1); default: equal.
        names: how messages call the members (default "member 0", "member 1", ...).

    Raises:
        ValueError: fewer than one member, a weight list of another length or with a negative or
            all-zero weight, or members with different vocabularies / special tokens.
    """

    config_class = EnsembleConfig
    main_input_name = "input_ids"
    _supports_cache_class = True

    def __init__(self, members: Sequence[nn.Module], weights: Sequence[float] | None = None, names=None):
        members = list(members)
        if not members:
            raise ValueError("an ensemble needs at least one member")
        names = list(names) if names is not None else [f"member {i}" for i in range(len(members))]
        check_same_vocabulary([m.config for m in members], names)
        if weights is None:
            weights = [1.0] * len(members)
        weights = [float(w) for w in weights]
        if len(weights) != len(members):
            raise ValueError(f"{len(weights)} weight(s) for {len(members)} ensemble members; give one per member")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"ensemble weights must be >= 0 and not all 0; got {weights}")
        total = sum(weights)
        first = members[0].config
        limits = [getattr(m.config, "max_position_embeddings", None) for m in members]
        limits = [x for x in limits if x is not None]
        config = EnsembleConfig(
            weights=[w / total for w in weights],
            # the longest source every member can read (None: no member has a position table)
            max_position_embeddings=min(limits) if limits else None,
            **{field: getattr(first, field, None) for field in _SHARED_TOKEN_FIELDS},
        )
        super().__init__(config)
        self.members = nn.ModuleList(members)
        self.member_names = names
        self.generation_config = GenerationConfig.from_dict(members[0].generation_config.to_dict())
        self.register_buffer("_weights", torch.tensor(config.weights, dtype=torch.float32), persistent=False)

    # transformers' PreTrainedModel hooks that do not apply: the members are initialised already.
    def _init_weights(self, module) -> None:
        pass

    def _max_decoder_positions(self) -> int | None:
        """The tightest position limit of any member (None when none has one)."""
        limits = [m._max_decoder_positions() for m in self.members if hasattr(m, "_max_decoder_positions")]
        limits = [x for x in limits if x is not None]
        return min(limits) if limits else None

    # -- generate's encoder step, input expansion and cache: once per member ------------------

    def _maybe_prepare_encoder_kwargs_for_generation(
        self, inputs_tensor, model_kwargs, model_input_name, generation_config
    ):
        outputs = []
        for member in self.members:
            member_kwargs = {k: v for k, v in model_kwargs.items() if k != "encoder_outputs"}
            member_kwargs = member._maybe_prepare_encoder_kwargs_for_generation(
                inputs_tensor, member_kwargs, model_input_name, generation_config
            )
            outputs.append(member_kwargs["encoder_outputs"])
        model_kwargs["encoder_outputs"] = EnsembleEncoderOutput(
            last_hidden_state=outputs[0].last_hidden_state, members=tuple(outputs)
        )
        return model_kwargs

    def _expand_inputs_for_generation(self, expand_size=1, is_encoder_decoder=False, input_ids=None, **model_kwargs):
        encoder_outputs = model_kwargs.pop("encoder_outputs", None)
        attention_mask = model_kwargs.get("attention_mask")
        # The plain tensors (decoder ids, the mask generate itself reads) as any model; each
        # member's encoder output and source mask by that member's own rule.
        input_ids, model_kwargs = super()._expand_inputs_for_generation(
            expand_size, is_encoder_decoder=False, input_ids=input_ids, **model_kwargs
        )
        if encoder_outputs is not None:
            outputs, masks = [], []
            for member, output in zip(self.members, encoder_outputs.members):
                member_kwargs = {"encoder_outputs": output}
                if attention_mask is not None:
                    member_kwargs["attention_mask"] = attention_mask
                _, member_kwargs = member._expand_inputs_for_generation(
                    expand_size, is_encoder_decoder=True, input_ids=None, **member_kwargs
                )
                outputs.append(member_kwargs["encoder_outputs"])
                masks.append(member_kwargs.get("attention_mask"))
            model_kwargs["encoder_outputs"] = EnsembleEncoderOutput(
                last_hidden_state=outputs[0].last_hidden_state, members=tuple(outputs), attention_masks=tuple(masks)
            )
        return input_ids, model_kwargs

    def _reorder_cache(self, cache: EnsembleCache, beam_idx: torch.LongTensor) -> EnsembleCache:
        """Beam search: every member keeps its surviving beams, by the member's own rule (its
        ``_reorder_cache`` where it has one, else its cache's ``reorder_cache``)."""
        for m, member in enumerate(self.members):
            member_cache = cache.members[m]
            if member_cache is None:
                continue
            if hasattr(member, "_reorder_cache"):
                cache.members[m] = member._reorder_cache(member_cache, beam_idx)
            else:
                member_cache.reorder_cache(beam_idx)
        return cache

    def _prepare_cache_for_generation(
        self, generation_config, model_kwargs, generation_mode, batch_size, max_cache_length
    ) -> None:
        if generation_config.cache_implementation is not None:
            raise ValueError(
                f"cache_implementation={generation_config.cache_implementation!r}: an ensemble keeps each "
                "member's own dynamic cache; leave cache_implementation unset"
            )
        if model_kwargs.get("cache") is not None or generation_config.use_cache is False:
            return
        caches = []
        for member in self.members:
            member_kwargs = {}
            member._prepare_cache_for_generation(
                generation_config, member_kwargs, generation_mode, batch_size, max_cache_length
            )
            caches.append(member_kwargs.get("cache"))  # None: the member's forward makes its own
        model_kwargs["cache"] = EnsembleCache(caches)

    def _supports_default_dynamic_cache(self) -> bool:
        return False

    def prepare_inputs_for_generation(self, input_ids, cache=None, encoder_outputs=None, **kwargs):
        """Each member's own inputs for this step, from its own ``prepare_inputs_for_generation``."""
        member_inputs = []
        for m, member in enumerate(self.members):
            member_kwargs = dict(kwargs)
            if encoder_outputs is not None and encoder_outputs.attention_masks is not None:
                member_kwargs["attention_mask"] = encoder_outputs.attention_masks[m]
            inputs = member.prepare_inputs_for_generation(
                input_ids,
                cache=cache.members[m] if cache is not None else None,
                encoder_outputs=encoder_outputs.members[m] if encoder_outputs is not None else None,
                **member_kwargs,
            )
            member_inputs.append(inputs)
        return {"member_inputs": member_inputs, "cache": cache}

    # -- one decoding step ----------------------------------------------------------------------

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        member_inputs: list[dict] | None = None,
        cache: EnsembleCache | None = None,
        return_dict: bool = True,
        **kwargs,
    ) -> EnsembleOutput:
        """The weighted mean of the members' next-token log-probabilities.

        Called by ``generate`` with ``member_inputs`` (from :meth:`prepare_inputs_for_generation`);
        called directly with ``input_ids`` / ``attention_mask`` / ``decoder_input_ids`` it
        teacher-forces every member on the same target prefix.

        Returns:
            EnsembleOutput: ``logits`` (batch, tgt_len, vocab_size) float32 log-probabilities (each
            row sums to 1 in probability only up to the product-of-experts normalisation); ``cache``.
        """
        if member_inputs is None:
            member_inputs = [
                {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}
                for _ in self.members
            ]
        combined = None
        caches = []
        for m, (member, inputs) in enumerate(zip(self.members, member_inputs)):
            inputs = {k: v for k, v in inputs.items() if k not in ("output_attentions", "output_hidden_states")}
            out = member(**inputs, return_dict=True)
            log_probs = torch.log_softmax(out.logits.float(), dim=-1) * self._weights[m]
            combined = log_probs if combined is None else combined + log_probs
            caches.append(getattr(out, "cache", None))
        return EnsembleOutput(logits=combined, cache=EnsembleCache(caches) if cache is not None else None)


__all__ = [
    "EnsembleCache",
    "EnsembleConfig",
    "EnsembleForConditionalGeneration",
    "EnsembleOutput",
    "check_same_vocabulary",
]
