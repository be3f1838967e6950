"""Translate with a CTranslate2 folder written by ``attention-seq2seq export --format ct2``.

The folder holds the CTranslate2 model, our tokenizer and ``generation_config.json``; the
tokenizer turns sentences into token strings (``</s>`` included), ``ctranslate2.Translator``
decodes from ``<s>``, and the tokenizer turns the output tokens back into text. The decoding
options are the ``generate`` keyword arguments the PyTorch path takes (``num_beams``,
``max_new_tokens``, ``length_penalty``, ``num_return_sequences``, sampling), mapped to
CTranslate2's names; defaults come from the folder's ``generation_config.json``.

Threads. CTranslate2 can spend ``threads`` CPU cores two ways: ``inter_threads = threads``
batches side by side, one core each (the default here: ``translate`` hands it files of many
batches), or one batch at a time on ``intra_threads = threads`` (OpenMP inside each matrix
product). ``ATTENTION_SEQ2SEQ_CT2_THREADS=intra`` (or ``load_ct2(thread_layout="intra")``) takes
the second (:func:`translation.engine.thread_layout`; docs/deploy.md gives the measurements behind
the default). CTranslate2 picks its kernels' instruction set itself; its own ``CT2_FORCE_CPU_ISA``
overrides that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from ..common.errors import UserError
from .ct2_folder import MARKER_FILE, is_ct2_folder
from .engine import thread_layout as pick_thread_layout

BEAM_PATIENCE = 2


@dataclass
class ThreadLayout:
    """How a Translator spends its threads, and why (:func:`translation.engine.thread_layout`)."""

    intra_threads: int
    inter_threads: int
    reason: str

    @property
    def name(self) -> str:
        return "inter" if self.inter_threads > 1 else "intra"


@dataclass
class CT2Model:
    """A loaded CTranslate2 folder: the translator, its ``generation_config`` and a minimal
    ``config`` (``model_type`` "ctranslate2") so it stands where a transformers model does."""

    translator: object
    generation_config: object
    config: SimpleNamespace
    path: Path
    thread_layout: ThreadLayout | None = None

    def __call__(self, *args, **kwargs):  # pragma: no cover - a guard, not an API
        raise TypeError("a CTranslate2 model only translates; it returns no logits")


def load_ct2(
    path,
    *,
    device: str | None = None,
    threads: int | None = None,
    compute_type: str = "default",
    thread_layout: str | None = None,
):
    """``(CT2Model, tokenizer)`` for the folder ``path``.

    Args:
        device: "cpu" or "cuda" (default: cuda when CTranslate2 sees a GPU, else cpu).
        threads: CPU cores for translation (default: torch's thread count).
        compute_type: CTranslate2's compute type; "default" keeps the exported quantization.
        thread_layout: "inter" or "intra" on a CPU (None: ``$ATTENTION_SEQ2SEQ_CT2_THREADS``, else
            "inter": :func:`translation.engine.thread_layout`); a GPU runs one batch at a time.
            The choice is in ``model.thread_layout``.

    Raises:
        UserError: ctranslate2 is not installed, the folder cannot be loaded, or an unknown layout.
    """
    try:
        import ctranslate2
    except ImportError:
        raise UserError(
            f"{path} is a CTranslate2 model; install it with pip install 'attention-seq2seq[ct2]'"
        ) from None
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    path = Path(path)
    if device is None:
        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device {device}: a CTranslate2 model runs on cpu or cuda")
    threads = threads or torch.get_num_threads()
    if device == "cpu":
        name, why = pick_thread_layout("ctranslate2", thread_layout)
        layout = ThreadLayout(threads, 1, why) if name == "intra" else ThreadLayout(1, threads, why)
    else:
        layout = ThreadLayout(threads, 1, "a GPU: one batch at a time")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        generation_config = GenerationConfig.from_pretrained(path)
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
        translator = ctranslate2.Translator(
            str(path),
            device=device,
            compute_type=compute_type,
            inter_threads=layout.inter_threads,
            intra_threads=layout.intra_threads,
        )
    except (OSError, RuntimeError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"cannot load CTranslate2 model {path}: {first_line}") from None
    config = SimpleNamespace(model_type="ctranslate2", max_position_embeddings=marker.get("max_position_embeddings"))
    return CT2Model(translator, generation_config, config, path, layout), tokenizer


def ct2_options(model: CT2Model, **generate_kwargs) -> dict:
    """``translate_batch`` options from ``generate`` keyword arguments and the folder's
    ``generation_config``. Beam search waits for ``BEAM_PATIENCE`` x beam_size finished
    hypotheses, which reproduces transformers' stopping rule on our test sets.

    ``max_new_tokens`` (which counts ``</s>``) becomes ``max_decoding_length``, capped as our
    ``generate`` caps it: the decoder reads at most ``max_position_embeddings`` positions.

    Raises:
        UserError: an option CTranslate2 cannot honour (named).
    """
    defaults = model.generation_config
    known = {"num_beams", "max_new_tokens", "length_penalty", "num_return_sequences", "do_sample", "top_k",
             "top_p", "temperature"}  # fmt: skip
    unknown = sorted(set(generate_kwargs) - known)
    if unknown:
        raise UserError(f"a CTranslate2 model does not take the decoding option(s) {', '.join(unknown)}")
    num_beams = generate_kwargs.get("num_beams", defaults.num_beams or 1)
    max_new_tokens = generate_kwargs.get("max_new_tokens", defaults.max_new_tokens or 128)
    limit = model.config.max_position_embeddings
    if limit and max_new_tokens > limit - 1 and "max_new_tokens" not in generate_kwargs:
        max_new_tokens = limit - 1
    length_penalty = generate_kwargs.get("length_penalty", defaults.length_penalty)
    options = {
        "beam_size": num_beams,
        "max_decoding_length": max_new_tokens,
        "length_penalty": 1.0 if length_penalty is None else length_penalty,
        "num_hypotheses": generate_kwargs.get("num_return_sequences", 1),
        "return_scores": True,
    }
    if num_beams > 1:
        # transformers' beam search (early_stopping=False) keeps going while a running beam could
        # still beat the finished ones; CTranslate2 stops once beam_size hypotheses have finished
        # unless told to wait for patience x beam_size (Kasai et al. 2022, "Beam Decoding with
        # Controlled Patience"). With 2 its beam-5 output matched generate's on the Bible test
        # chapters where 1 differed on 4 of 60 sentences (docs/deploy.md).
        options["patience"] = BEAM_PATIENCE
    if generate_kwargs.get("do_sample"):
        options.update(
            sampling_topk=generate_kwargs.get("top_k") or 0,  # 0: the whole vocabulary
            sampling_topp=generate_kwargs.get("top_p") or 1.0,
            sampling_temperature=generate_kwargs.get("temperature") or 1.0,
        )
        if num_beams > 1:
            raise UserError("a CTranslate2 model samples with one beam; drop --num-beams or --do-sample")
    if options["num_hypotheses"] > max(num_beams, 1) and not generate_kwargs.get("do_sample"):
        raise UserError(f"--n-best {options['num_hypotheses']} needs --num-beams of at least that many")
    return options


def _translate_ids(
    model: CT2Model, tokenizer, ids: list[list[int]], options: dict, max_batch_size: int, batch_type: str
):
    """Per row of token ids, (text, score) pairs best first, from CTranslate2's ``translate_batch``
    (which sorts by length, batches and restores the order itself)."""
    tokens = [tokenizer.convert_ids_to_tokens(row) for row in ids]
    results = model.translator.translate_batch(tokens, max_batch_size=max_batch_size, batch_type=batch_type, **options)
    found = []
    for result in results:
        hypotheses = []
        for hypothesis, score in zip(result.hypotheses, result.scores):
            row = tokenizer.convert_tokens_to_ids(hypothesis)
            hypotheses.append((tokenizer.decode(row, skip_special_tokens=True).strip(), float(score)))
        found.append(hypotheses)
    return found


class CTranslate2Backend:
    """The translation engine's backend for a CTranslate2 folder (`translation.engine.TorchBackend`
    describes the interface). CTranslate2 sorts and batches the whole list itself (``batch_size``
    sentences, or ``batch_tokens`` source tokens); its score is log p(y | x) / |y|^α only, so a
    hypothesis's total log-probability is nan."""

    sorts_and_batches = True
    attention_weights = False

    def __init__(self, model: CT2Model, tokenizer, generate_kwargs: dict, options):
        self.model, self.tokenizer, self.scores = model, tokenizer, options.scores
        self.ct2_options = ct2_options(model, **generate_kwargs)
        self.max_batch_size = options.batch_tokens or options.batch_size or 32
        self.batch_type = "tokens" if options.batch_tokens else "examples"

    def translate_batch(self, ids: list[list[int]], constraints=None, lines=()):
        from .engine import Hypothesis

        found = _translate_ids(self.model, self.tokenizer, ids, self.ct2_options, self.max_batch_size, self.batch_type)
        nan = float("nan")
        return [
            [Hypothesis(text, nan if self.scores else None, score if self.scores else None) for text, score in row]
            for row in found
        ]


def translate_ct2(
    model: CT2Model,
    tokenizer,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    max_batch_tokens: int | None = None,
    max_source_length: int | None = None,
    **generate_kwargs,
) -> list[list[tuple[str, float]]]:
    """Translate ``sentences`` with CTranslate2 alone (no engine: for checks that compare the
    runtime with ``generate``); per sentence, ``num_return_sequences`` (text, score) pairs, best
    first. Scores are CTranslate2's: the log-probability divided by length^length_penalty. Empty
    lines give "". The commands translate through `translation.engine.Translator`, which uses
    `CTranslate2Backend`.
    """
    options = ct2_options(model, **generate_kwargs)
    keep = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    outputs: list[list[tuple[str, float]]] = [[("", 0.0)] * options["num_hypotheses"] for _ in sentences]
    if not keep:
        return outputs
    encoded = tokenizer(
        [sentences[i] for i in keep], truncation=max_source_length is not None, max_length=max_source_length
    )["input_ids"]
    found = _translate_ids(
        model,
        tokenizer,
        encoded,
        options,
        max_batch_tokens or batch_size,
        "tokens" if max_batch_tokens else "examples",
    )
    for i, hypotheses in zip(keep, found):
        outputs[i] = hypotheses
    return outputs


__all__ = [
    "CT2Model",
    "CTranslate2Backend",
    "ThreadLayout",
    "ct2_options",
    "is_ct2_folder",
    "load_ct2",
    "translate_ct2",
]
