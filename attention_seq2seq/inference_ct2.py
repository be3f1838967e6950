"""Translate with a CTranslate2 folder written by ``attention-seq2seq export --format ct2``.

The folder holds the CTranslate2 model, our tokenizer and ``generation_config.json``; the
tokenizer turns sentences into token strings (``</s>`` included), ``ctranslate2.Translator``
decodes from ``<s>``, and the tokenizer turns the output tokens back into text. The decoding
options are the ``generate`` keyword arguments the PyTorch path takes (``num_beams``,
``max_new_tokens``, ``length_penalty``, ``num_return_sequences``, sampling), mapped to
CTranslate2's names; defaults come from the folder's ``generation_config.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from .errors import UserError
from .hub.ct2_folder import MARKER_FILE, is_ct2_folder

BEAM_PATIENCE = 2


@dataclass
class CT2Model:
    """A loaded CTranslate2 folder: the translator, its ``generation_config`` and a minimal
    ``config`` (``model_type`` "ctranslate2") so it stands where a transformers model does."""

    translator: object
    generation_config: object
    config: SimpleNamespace
    path: Path

    def __call__(self, *args, **kwargs):  # pragma: no cover - a guard, not an API
        raise TypeError("a CTranslate2 model only translates; it returns no logits")


def load_ct2(path, *, device: str | None = None, threads: int | None = None, compute_type: str = "default"):
    """``(CT2Model, tokenizer)`` for the folder ``path``.

    Args:
        device: "cpu" or "cuda" (default: cuda when CTranslate2 sees a GPU, else cpu).
        threads: CPU threads per translation (default: torch's thread count).
        compute_type: CTranslate2's compute type; "default" keeps the exported quantization.

    Raises:
        UserError: ctranslate2 is not installed, or the folder cannot be loaded.
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
    try:
        translator = ctranslate2.Translator(
            str(path),
            device=device,
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=threads or torch.get_num_threads(),
        )
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        generation_config = GenerationConfig.from_pretrained(path)
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, RuntimeError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"cannot load CTranslate2 model {path}: {first_line}") from None
    config = SimpleNamespace(model_type="ctranslate2", max_position_embeddings=marker.get("max_position_embeddings"))
    return CT2Model(translator, generation_config, config, path), tokenizer


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


def translate_ct2(
    model: CT2Model,
    tokenizer,
    sentences: Sequence[str],
    *,
    batch_size: int = 32,
    max_batch_tokens: int | None = None,
    max_source_length: int | None = None,
    progress: bool = False,
    scores: bool = True,
    **generate_kwargs,
) -> list[list[tuple[str, float]]]:
    """Translate ``sentences``; per sentence, ``num_return_sequences`` (text, score) pairs, best first.

    CTranslate2 sorts the sentences by length, batches them (``batch_size`` sentences, or
    ``max_batch_tokens`` source tokens when given) and restores the input order. Scores are
    CTranslate2's: the log-probability divided by length^length_penalty. Empty lines give "".
    ``progress`` and ``scores`` are accepted for the PyTorch path's signature (CTranslate2
    translates the whole list in one call and always scores).
    """
    options = ct2_options(model, **generate_kwargs)
    keep = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    n_best = options["num_hypotheses"]
    outputs: list[list[tuple[str, float]]] = [[("", 0.0)] * n_best for _ in sentences]
    if not keep:
        return outputs
    encoded = tokenizer(
        [sentences[i] for i in keep], truncation=max_source_length is not None, max_length=max_source_length
    )["input_ids"]
    tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in encoded]
    results = model.translator.translate_batch(
        tokens,
        max_batch_size=max_batch_tokens or batch_size,
        batch_type="tokens" if max_batch_tokens else "examples",
        **options,
    )
    for i, result in zip(keep, results):
        hypotheses = []
        for hypothesis, score in zip(result.hypotheses, result.scores):
            ids = tokenizer.convert_tokens_to_ids(hypothesis)
            hypotheses.append((tokenizer.decode(ids, skip_special_tokens=True).strip(), float(score)))
        outputs[i] = hypotheses
    return outputs


__all__ = ["CT2Model", "ct2_options", "is_ct2_folder", "load_ct2", "translate_ct2"]
