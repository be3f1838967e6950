"""Translate with an ``export --format onnx`` folder through the translation engine.

The decoding itself is translation/onnx_runtime.py (numpy + onnxruntime, shipped in the folder);
this module loads a folder as a model the engine takes (:func:`load_onnx`), maps the ``generate``
options onto the runtime's and decodes the engine's sentences (:class:`OnnxBackend`).

Threads. As with CTranslate2 (translation/ct2.py), ``threads`` cores go into ``threads``
batches side by side, one core each (``inter``, the default: one session called from a pool of
Python threads; onnxruntime releases the GIL while a graph runs), or into one batch at a time
(``intra``: onnxruntime's intra-op threads), which ``ATTENTION_SEQ2SEQ_ONNX_THREADS=intra`` (or
``load_onnx(thread_layout="intra")``) takes (:func:`translation.engine.thread_layout`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..common.errors import UserError
from .engine import thread_layout as pick_thread_layout
from .onnx_folder import read_marker

#: The generate() options the runtime takes; anything else is refused by name.
KNOWN_OPTIONS = ("num_beams", "max_new_tokens", "max_length", "min_new_tokens", "length_penalty",
                 "num_return_sequences", "early_stopping", "do_sample")  # fmt: skip


@dataclass
class OnnxModel:
    """A loaded ONNX folder: the runtime, its ``generation_config`` and a minimal ``config``
    (``model_type`` "onnx") so it stands where a transformers model does."""

    runner: object  # onnx_runtime.OnnxSeq2Seq
    generation_config: object
    config: SimpleNamespace
    path: Path
    threads: int
    thread_layout: str
    layout_reason: str

    def __call__(self, *args, **kwargs):  # pragma: no cover - a guard, not an API
        raise TypeError("an ONNX export translates through translate/evaluate; it is not a torch module")


def _run_batches(runner, batches, workers: int, **options):
    if workers <= 1:
        return [runner.generate(batch, **options) for batch in batches]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda batch: runner.generate(batch, **options), batches))


def load_onnx(path, *, threads: int | None = None, thread_layout: str | None = None):
    """``(OnnxModel, tokenizer)`` for the export folder ``path``.

    Args:
        threads: CPU cores for translation (default: torch's thread count).
        thread_layout: "inter" or "intra" (None: ``$ATTENTION_SEQ2SEQ_ONNX_THREADS``, else "inter":
            :func:`translation.engine.thread_layout`).

    Raises:
        UserError: onnxruntime is not installed, the folder cannot be loaded (naming the file), or
            an unknown layout.
    """
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        raise UserError(
            f"{path} is an ONNX export; install its runtime with pip install 'attention-seq2seq[onnx]'"
        ) from None
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from .onnx_runtime import OnnxSeq2Seq

    path = Path(path)
    threads = threads or torch.get_num_threads()
    layout, reason = pick_thread_layout("onnx", thread_layout)
    try:
        spec = read_marker(path)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        generation_config = GenerationConfig.from_pretrained(path)
        runner = OnnxSeq2Seq(path, intra_threads=threads if layout == "intra" else 1)
    except (OSError, ValueError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserError(f"cannot load ONNX export {path}: {first}") from None
    config = SimpleNamespace(
        model_type="onnx",
        max_position_embeddings=spec["generation"].get("max_decoder_positions"),
        source_model_type=spec.get("source_model_type"),
    )
    return OnnxModel(runner, generation_config, config, path, threads, layout, reason), tokenizer


class OnnxBackend:
    """The translation engine's backend for an ONNX export (`translation.engine.TorchBackend`
    describes the interface). It takes the whole list (``sorts_and_batches``): sorted by length
    and cut by ``batch_size`` / ``batch_tokens`` as the engine cuts them, then decoded one batch
    at a time (``intra``) or ``threads`` at a time (``inter``)."""

    sorts_and_batches = True
    attention_weights = False

    def __init__(self, model: OnnxModel, tokenizer, generate_kwargs: dict, options):
        unknown = sorted(set(generate_kwargs) - set(KNOWN_OPTIONS))
        if unknown:
            raise UserError(f"an ONNX export does not take the decoding option(s) {', '.join(unknown)}")
        if generate_kwargs.get("do_sample"):
            raise UserError("an ONNX export decodes greedily or with beam search; --do-sample needs the PyTorch model")
        self.model, self.tokenizer, self.options = model, tokenizer, options
        self.kwargs = {k: v for k, v in generate_kwargs.items() if k != "do_sample"}
        try:
            model.runner.max_length(self.kwargs.get("max_new_tokens"), self.kwargs.get("max_length"))
        except ValueError as error:
            raise UserError(f"--max-new-tokens: {error}") from None

    def translate_batch(self, ids: list[list[int]], constraints=None, lines=()):
        from .engine import Hypothesis, token_budget_batches

        options = self.options
        batches = token_budget_batches([len(row) for row in ids], options.batch_size, options.batch_tokens)
        workers = self.model.threads if self.model.thread_layout == "inter" else 1
        found = _run_batches(self.model.runner, [[ids[k] for k in batch] for batch in batches], workers, **self.kwargs)
        results: list = [None] * len(ids)
        for batch, hypotheses in zip(batches, found):
            for k, row in zip(batch, hypotheses):
                texts = self.tokenizer.batch_decode([h.tokens for h in row], skip_special_tokens=True)
                results[k] = [
                    Hypothesis(
                        text.strip(),
                        h.logprob if options.scores else None,
                        h.score if options.scores else None,
                    )
                    for text, h in zip(texts, row)
                ]
        return results


__all__ = ["OnnxBackend", "OnnxModel", "load_onnx"]
