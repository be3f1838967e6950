"""The one translation engine: sentences in, ``n_best`` hypotheses per sentence out.

Every command that translates goes through :class:`Translator`: ``translate`` (streaming files,
translation/files.py), ``evaluate`` and the benchmarks (``translation.loading.translate`` /
``translate_n_best``, thin wrappers). So there is one way to

- encode: the tokenizer with its special tokens; a sentence longer than ``max_source_length``
  (default: the model's limit, :func:`model_source_limit`) is cut keeping its ``</s>``, counted in
  :class:`RunStats` (or refused with ``truncate=False``); an empty line never reaches the model;
- batch: sentences sorted by length in tokens, longest first, cut into batches of at most
  ``batch_size`` sentences and, with ``batch_tokens``, at most that many padded source tokens
  (:func:`token_budget_batches`), as every NMT toolkit does at inference; results go back in
  input order;
- decode: the model's own ``generate`` (every generation option; an ensemble is a model too),
  lexically constrained beam search for lines with terminology constraints
  (translation/constraints.py), CTranslate2's translator for an ``export --format ct2`` folder, or
  onnxruntime for an ``export --format onnx`` folder (translation/onnx_runtime.py);
- score: per hypothesis the total log-probability Σₜ log p(yₜ | y<ₜ, x) over the generated tokens
  including ``</s>`` and the length-normalised score search ranks by (log p / length^α), and
  Pharaoh word alignments from the attention weights (attention/alignment.py).

A new decoding option is one keyword in ``generate_kwargs``; a new output is one field of
:class:`Hypothesis`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..common.errors import UserError
from ..modeling.generation_lengths import eos_token_ids


@dataclass
class TranslationOptions:
    """What the engine does besides decoding (the ``generate`` kwargs go separately)."""

    batch_size: int | None = 32  # sentences per batch (None: only batch_tokens caps a batch)
    batch_tokens: int | None = None  # padded source tokens per batch
    max_source_length: int | None = None  # None: the model's limit
    truncate: bool = True  # False: an over-long line is an error
    n_best: int = 1
    scores: bool = False
    align: bool = False
    align_layer: int = -1
    align_heads: Sequence[int] | None = None
    # Terminology constraints: per input line (0-based, the whole input, not one chunk), a list of
    # target phrases as token ids that its translation must contain (translation/constraints.py);
    # None: no constraints at all.
    constraints: Sequence[Sequence[Sequence[int]]] | None = None


@dataclass
class Hypothesis:
    text: str
    logprob: float | None = None  # total natural-log probability (None without scores)
    score: float | None = None  # logprob / length^length_penalty, what search ranks by
    alignment: str | None = None  # Pharaoh line


@dataclass
class RunStats:
    sources: int = 0  # sources handled in this run (written or already there)
    skipped: int = 0  # sources found complete in the output by --resume
    truncated: int = 0
    first_truncated: int | None = None  # 1-based input line
    empty: int = 0
    extra: dict = field(default_factory=dict)


def is_ct2(model) -> bool:
    """Whether ``model`` is a CTranslate2 folder loaded by translation/ct2.py (``export --format ct2``)."""
    return getattr(getattr(model, "config", None), "model_type", None) == "ctranslate2"


#: What the message of a refused option calls a model decoded by its own runtime, by its
#: ``config.model_type`` (also its ``ModelLocation.kind``).
RUNTIME_NAMES = {"ctranslate2": "a CTranslate2 folder", "onnx": "an ONNX export"}
#: The variable that sets a runtime's CPU thread layout (:func:`thread_layout`), by ``model_type``.
THREAD_LAYOUT_ENV = {"ctranslate2": "ATTENTION_SEQ2SEQ_CT2_THREADS", "onnx": "ATTENTION_SEQ2SEQ_ONNX_THREADS"}


def thread_layout(model_type: str, asked: str | None = None) -> tuple[str, str]:
    """``(layout, why)``: how a runtime spends its ``threads`` CPU cores. ``"inter"``, the
    default: ``threads`` batches side by side, one core each (what a file of many batches wants;
    docs/deploy.md gives the measurements); ``"intra"``: all cores inside one batch at a time.
    ``asked``, else the runtime's variable (:data:`THREAD_LAYOUT_ENV`), else the default.

    Raises:
        UserError: another value (named with where it came from, and the valid ones).
    """
    env = THREAD_LAYOUT_ENV[model_type]
    source, layout = ("thread_layout", asked) if asked else (env, os.environ.get(env))
    if not layout:
        return "inter", "the default"
    if layout not in ("inter", "intra"):
        raise UserError(f"{source}={layout}: the thread layout of {RUNTIME_NAMES[model_type]} is inter or intra")
    return layout, f"{source}={layout}"


def is_onnx(model) -> bool:
    """Whether ``model`` is an ONNX export loaded by translation/onnx_backend.py (``export --format onnx``)."""
    return getattr(getattr(model, "config", None), "model_type", None) == "onnx"


def model_source_limit(model, tokenizer) -> int | None:
    """The longest source the model takes: ``max_position_embeddings`` (Transformer) or the
    tokenizer's ``model_max_length`` when that is a real limit; None when there is none."""
    limit = getattr(model.config, "max_position_embeddings", None)
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if tok_limit is not None and tok_limit < 1_000_000:
        limit = min(limit, tok_limit) if limit else tok_limit
    return limit


def _generated_mask(generated: torch.Tensor, eos_ids: set[int], pad_id: int | None) -> torch.Tensor:
    """(rows, new_tokens) bool: the generated tokens up to and including the first ``</s>``."""
    is_eos = torch.zeros_like(generated, dtype=torch.bool)
    for eos in eos_ids:
        is_eos |= generated == eos
    before = torch.cumsum(is_eos.int(), dim=1) - is_eos.int()  # </s> seen before this position
    return before == 0


# ---------------------------------------------------------------------------------------------
# Backends: one batch of token ids in, ``n_best`` hypotheses per row out


class TorchBackend:
    """Decodes with the model's own ``generate`` (a transformers model; an ensemble is one too).

    The interface every backend has (a third runtime is one new module with such a class and one
    line in :func:`backend_for`):

    - ``__init__(model, tokenizer, generate_kwargs, options)``, raising `UserError` for an option
      the runtime cannot take;
    - ``translate_batch(ids, constraints, lines)``: ``ids`` a list of token-id rows (no padding),
      ``constraints`` None or one list of token-id phrases per row, ``lines`` the rows' 1-based
      input lines (for messages); returns per row ``n_best`` `Hypothesis` (text, and with
      ``options.scores`` logprob and score), best first;
    - ``sorts_and_batches``: True when the runtime sorts and batches a whole list itself
      (CTranslate2), so the engine hands it every sentence at once; False: the engine's batches;
    - ``attention_weights``: whether word alignments can be read from the model.
    """

    sorts_and_batches = False
    attention_weights = True

    def __init__(self, model, tokenizer, generate_kwargs: dict, options: TranslationOptions):
        if options.constraints is not None and generate_kwargs.get("do_sample"):
            raise UserError("--constraints runs a beam search; it does not combine with --do-sample")
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.device = next(model.parameters()).device
        self.kwargs = dict(generate_kwargs)
        if options.scores:
            self.kwargs.update(output_scores=True, return_dict_in_generate=True)
        config = model.generation_config
        self.eos_ids = eos_token_ids(config)
        self.pad_id = config.pad_token_id
        alpha = self.kwargs.get("length_penalty", config.length_penalty)
        self.length_penalty = 1.0 if alpha is None else float(alpha)

    def translate_batch(
        self, ids: list[list[int]], constraints: list | None = None, lines: Sequence[int] = ()
    ) -> list[list[Hypothesis]]:
        padded = self.tokenizer.pad({"input_ids": ids}, return_tensors="pt")
        inputs = {
            "input_ids": padded["input_ids"].to(self.device),
            "attention_mask": padded["attention_mask"].to(self.device),
        }
        if constraints is None or not any(constraints):
            out = self.model.generate(**inputs, **self.kwargs)  # no line of this batch has any: plain generate
        else:
            from .constraints import constrained_decoding

            try:
                out = self.model.generate(
                    **inputs, custom_generate=constrained_decoding, constraints=constraints, **self.kwargs
                )
            except ValueError as error:  # a phrase longer than the output may be, say
                raise UserError(f"--constraints (lines {', '.join(map(str, lines))}): {error}") from None
        sequences = out.sequences if self.options.scores else out  # (rows * n_best, 1 + new_tokens)
        texts = [t.strip() for t in self.tokenizer.batch_decode(sequences, skip_special_tokens=True)]
        logprobs = normalised = [None] * len(texts)
        if self.options.scores:
            logprobs, normalised = self.sequence_scores(out)
        n = self.options.n_best
        return [
            [Hypothesis(texts[flat], logprobs[flat], normalised[flat]) for flat in range(row * n, row * n + n)]
            for row in range(len(ids))
        ]

    def sequence_scores(self, out) -> tuple[list[float], list[float]]:
        """(total log-probability, length-normalised score) of each returned sequence.

        The total is the sum of `compute_transition_scores` over the generated tokens up to and
        including the first ``</s>``; the normalised score is beam search's ``sequences_scores``
        where there is one, else total / length^α.
        """
        if getattr(out, "scores", None) is None:
            # Constrained beam search keeps each hypothesis's score only: log p / length^α, with
            # length the generated tokens up to and including </s>, so the total is score × length^α.
            generated = out.sequences[:, 1:]
            lengths = _generated_mask(generated, self.eos_ids, self.pad_id)
            if self.pad_id is not None and self.pad_id not in self.eos_ids:
                lengths &= generated != self.pad_id  # a hypothesis cut by the length limit, padded
            normalised = out.sequences_scores.float()
            total = normalised * lengths.sum(dim=1).clamp(min=1).float() ** self.length_penalty
            return total.tolist(), normalised.tolist()
        beam_indices = getattr(out, "beam_indices", None)
        transition = self.model.compute_transition_scores(
            out.sequences, out.scores, beam_indices, normalize_logits=beam_indices is None
        )  # (rows, new_tokens)
        generated = out.sequences[:, -transition.size(1) :]
        mask = _generated_mask(generated, self.eos_ids, self.pad_id)
        if beam_indices is not None:
            mask &= beam_indices[:, : transition.size(1)] >= 0
        total = (transition.float() * mask).sum(dim=1)
        if getattr(out, "sequences_scores", None) is not None:
            normalised = out.sequences_scores.float()
        else:
            normalised = total / mask.sum(dim=1).clamp(min=1).float() ** self.length_penalty
        return total.tolist(), normalised.tolist()


def backend_for(model) -> type:
    """The backend class that decodes ``model``: CTranslate2 for an ``export --format ct2`` folder
    (translation/ct2.py), onnxruntime for an ``export --format onnx`` folder
    (translation/onnx_backend.py), else the model's own ``generate``."""
    if is_ct2(model):
        from .ct2 import CTranslate2Backend

        return CTranslate2Backend
    if is_onnx(model):
        from .onnx_backend import OnnxBackend

        return OnnxBackend
    return TorchBackend


# ---------------------------------------------------------------------------------------------
# The engine


class Translator:
    """Translates lists of sentences into `Hypothesis` lists (``n_best`` per sentence).

    ``loaded``: a `translation.loading.LoadedModel` (model and tokenizer); ``options``:
    `TranslationOptions` (or a subclass); ``generate_kwargs``: the decoding options, passed to the
    backend (``n_best`` sets ``num_return_sequences``, and ``num_beams`` when it is smaller and
    not given).

    Raises `UserError` for options the model cannot take (alignments or constraints with a
    CTranslate2 folder, alignments with an ensemble, constraints with sampling, ``n_best`` above
    an explicit ``num_beams``).
    """

    def __init__(self, loaded, options: TranslationOptions, generate_kwargs: dict):
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.options = options
        backend_class = backend_for(self.model)
        runtime = RUNTIME_NAMES.get(getattr(self.model.config, "model_type", None))
        if options.align and not backend_class.attention_weights:
            raise UserError(
                f"--alignments reads the model's attention weights, which {runtime} does not "
                "return; use the PyTorch model (the training run or a --format remote/native export)"
            )
        if options.constraints is not None and runtime is not None:
            raise UserError(
                "--constraints needs the PyTorch model (constrained beam search runs in this package); "
                f"{runtime} cannot take it: use the training run or a --format remote/native export"
            )
        is_ensemble = getattr(self.model.config, "model_type", None) == "attention_seq2seq_ensemble"
        if is_ensemble and options.align:
            raise UserError(
                "--alignments reads one model's attention weights; an ensemble (-m given several times) "
                "has several: align with one of its models"
            )
        self.limit = options.max_source_length or model_source_limit(self.model, self.tokenizer)
        kwargs = dict(generate_kwargs)
        config = self.model.generation_config
        if options.n_best > 1:
            beams = kwargs.get("num_beams") or config.num_beams or 1
            if kwargs.get("do_sample"):
                kwargs["num_return_sequences"] = options.n_best  # K samples (not necessarily distinct)
            else:
                if beams < options.n_best:
                    if "num_beams" in generate_kwargs:
                        raise UserError(
                            f"--n-best {options.n_best} needs --num-beams >= {options.n_best}; got --num-beams {beams}"
                        )
                    kwargs["num_beams"] = options.n_best
                kwargs["num_return_sequences"] = options.n_best
        self.backend = backend_class(self.model, self.tokenizer, kwargs, options)
        self.eos_ids = eos_token_ids(config)

    def encode(self, sentences: Sequence[str], first_line: int, stats: RunStats) -> list[list[int]]:
        """Token ids of each sentence ([] for an empty one), truncated to the model's limit."""
        ids: list[list[int]] = [[] for _ in sentences]
        texts = [(k, s) for k, s in enumerate(sentences) if s.strip()]
        if texts:
            encoded = self.tokenizer([s for _, s in texts], add_special_tokens=True)["input_ids"]
            for (k, _), row in zip(texts, encoded):
                ids[k] = row
        for k, row in enumerate(ids):
            if not row:
                stats.empty += 1
            elif self.limit is not None and len(row) > self.limit:
                line = first_line + k
                if not self.options.truncate:
                    raise UserError(
                        f"line {line}: {len(row)} tokens, more than the limit of {self.limit} "
                        "(--max-source-length or the model's); drop --no-truncate to truncate such lines"
                    )
                stats.truncated += 1
                if stats.first_truncated is None:
                    stats.first_truncated = line
                # Keep the sentence end: the last piece of a tokenized sentence is </s>.
                keeps_eos = self.eos_ids and row[-1] in self.eos_ids
                ids[k] = row[: self.limit - 1] + row[-1:] if keeps_eos else row[: self.limit]
        return ids

    @torch.inference_mode()
    def translate(
        self,
        sentences: Sequence[str],
        first_line: int = 1,
        stats: RunStats | None = None,
        progress: Callable[[int], None] | None = None,
        shard: tuple[int, int] = (0, 1),
    ) -> list[list[Hypothesis] | None]:
        """``n_best`` hypotheses for each sentence, best first (empty sentences get empty
        hypotheses); ``first_line`` is the 1-based input line of ``sentences[0]``, for messages and
        for the constraints' line numbers; ``stats`` counts truncated and empty lines;
        ``progress(n)`` is called after each batch with its number of sentences.

        ``shard=(rank, world_size)``: decode only the batches ``rank, rank + world_size, ...`` of
        the sorted list (each process of a group calls it with its own rank); the others' sentences
        get None. Every process cuts the same batches, so the group's hypotheses are those of one
        process decoding everything."""
        stats = RunStats() if stats is None else stats
        options = self.options
        ids = self.encode(sentences, first_line, stats)
        empty = Hypothesis("", 0.0 if options.scores else None, 0.0 if options.scores else None)
        empty.alignment = "" if options.align else None
        result: list[list[Hypothesis] | None] = [None if row else [empty] * options.n_best for row in ids]
        if self.backend.sorts_and_batches:
            batches = [[k for k, row in enumerate(ids) if row]]
        else:
            batches = token_budget_batches([len(row) for row in ids], options.batch_size, options.batch_tokens)
        rank, world_size = shard
        for batch in batches[rank::world_size]:
            if not batch:
                continue
            constraints = None
            if options.constraints is not None:
                constraints = [list(options.constraints[first_line - 1 + k]) for k in batch]
            found = self.backend.translate_batch([ids[k] for k in batch], constraints, [first_line + k for k in batch])
            if options.align:
                self._align([sentences[k] for k in batch], found)
            for k, hypotheses in zip(batch, found):
                result[k] = hypotheses
            if progress is not None:
                progress(len(batch))
        return result

    def _align(self, sources: list[str], found: list[list[Hypothesis]]) -> None:
        """Fill each hypothesis's ``alignment`` (Pharaoh) from the model's cross-attention."""
        from ..attention.alignment import attention_alignments, format_pharaoh

        flat = [(source, h) for source, hypotheses in zip(sources, found) for h in hypotheses]
        keep = [(source, h) for source, h in flat if h.text]
        links = (
            attention_alignments(
                self.model,
                self.tokenizer,
                [source for source, _ in keep],
                [h.text for _, h in keep],
                layer=self.options.align_layer,
                heads=self.options.align_heads,
                max_source_length=self.limit,
            )
            if keep
            else []
        )
        for _, h in flat:
            h.alignment = format_pharaoh(set())
        for (_, h), x in zip(keep, links):
            h.alignment = format_pharaoh(x)


def token_budget_batches(lengths: Sequence[int], batch_size: int | None, batch_tokens: int | None) -> list[list[int]]:
    """Indices of ``lengths`` grouped into batches, longest sentences first.

    Each batch has at most ``batch_size`` sentences (None: no cap) and, with ``batch_tokens``, at most that many
    padded tokens (sentences × the longest's length); a sentence longer than ``batch_tokens`` goes
    alone. Empty sentences (length 0) are left out.
    """
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[current[0]] if current else lengths[i]  # sorted: the first is the longest
        too_many = batch_size is not None and len(current) >= batch_size
        too_big = batch_tokens is not None and current and (len(current) + 1) * longest > batch_tokens
        if current and (too_many or too_big):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches
