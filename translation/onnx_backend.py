"""Translate with an ``export --format onnx`` folder through the translation engine.

The decoding itself is translation/onnx_runtime.py (numpy + onnxruntime, shipped in the folder);
this module loads a folder as a model the engine takes (:func:`load_onnx`), maps the ``generate``
options onto the runtime's and decodes the engine's sentences (:class:`OnnxBackend`).

Threads. As with CTranslate2 (translation/ct2.py), ``threads`` cores can go into one batch at a
time (``intra``: onnxruntime's intra-op threads) or into ``threads`` batches at a time, one core
each (``inter``: one session called from a pool of Python threads; onnxruntime releases the GIL
while a graph runs). Which wins depends on the host and the model, so ``thread_layout="auto"``
times both on a synthetic workload once per CPU, onnxruntime version, thread count and model
size, and keeps the answer (``data/host_measurements``); ``ATTENTION_SEQ2SEQ_ONNX_THREADS=intra|inter``
fixes it instead.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

from ..errors import UserError
from ..data.host_measurements import cpu_name, measured, settled_medians
from .onnx_folder import read_marker

THREAD_LAYOUTS = ("auto", "intra", "inter")
THREAD_LAYOUT_ENV = "ATTENTION_SEQ2SEQ_ONNX_THREADS"
THREAD_LAYOUT_CACHE_FILE = "onnx_threads.json"
# The timed workload: threads x 2 batches of this many synthetic sentences, greedy, at most this
# many new tokens, the two layouts alternating, 3 to 9 rounds until the timings settle.
_PROBE_BATCH = 16
_PROBE_SOURCE_TOKENS = 20
_PROBE_NEW_TOKENS = 12
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


def _probe_rows(vocab_size: int, special: int, threads: int) -> list[list[int]]:
    span = max(vocab_size - special - 1, 1)
    return [
        [special + 1 + (7919 * i + 104729 * j) % span for j in range(_PROBE_SOURCE_TOKENS)]
        for i in range(max(threads, 1) * 2 * _PROBE_BATCH)
    ]


def _run_batches(runner, batches, workers: int, **options):
    if workers <= 1:
        return [runner.generate(batch, **options) for batch in batches]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda batch: runner.generate(batch, **options), batches))


def choose_thread_layout(path: Path, spec: dict, threads: int, layout: str | None = None, use_cache: bool = True):
    """("intra" | "inter", reason) for ``threads`` cores on this machine (see the module docstring).

    Raises:
        UserError: an unknown layout (named, with the valid ones).
    """
    layout = layout or os.environ.get(THREAD_LAYOUT_ENV) or "auto"
    if layout not in THREAD_LAYOUTS:
        raise UserError(f"ONNX thread layout {layout!r} ({THREAD_LAYOUT_ENV}): use one of {', '.join(THREAD_LAYOUTS)}")
    if threads <= 1:
        return "intra", "one thread"
    if layout != "auto":
        return layout, f"{layout} (asked for)"
    import onnxruntime

    from .onnx_runtime import OnnxSeq2Seq

    size = sum((path / spec["files"][name]).stat().st_size for name in ("encoder", "decoder"))
    key = {"cpu": cpu_name(), "onnxruntime": onnxruntime.__version__, "threads": threads, "model_bytes": size,
           "quantization": spec.get("quantization")}  # fmt: skip

    def measure() -> dict:
        print(
            "attention-seq2seq: timing onnxruntime's thread layouts on this machine (once per machine and model size)",
            file=sys.stderr,
        )
        runners = {"intra": OnnxSeq2Seq(path, intra_threads=threads), "inter": OnnxSeq2Seq(path, intra_threads=1)}
        rows = _probe_rows(spec.get("vocab_size", 100), 4, threads)
        batches = [rows[i : i + _PROBE_BATCH] for i in range(0, len(rows), _PROBE_BATCH)]
        options = dict(num_beams=1, max_new_tokens=_PROBE_NEW_TOKENS)
        workers = {"intra": 1, "inter": threads}
        for name, runner in runners.items():  # warm-up
            _run_batches(runner, batches[:1], 1, **options)

        def timer(name):
            def run():
                start = time.perf_counter()
                _run_batches(runners[name], batches, workers[name], **options)
                return time.perf_counter() - start

            return run

        medians, spread, rounds = settled_medians({name: timer(name) for name in runners})
        seconds = {name: round(value, 5) for name, value in medians.items()}
        return {"seconds": seconds, "spread": round(spread, 4), "rounds": rounds}

    entry, cached, store = measured(THREAD_LAYOUT_CACHE_FILE, key, measure, use_cache=use_cache, required=("seconds",))
    seconds = entry["seconds"]
    best = min(seconds, key=seconds.get)
    where = f"kept in {store} from {entry['measured_at']}" if cached else "measured now"
    reason = "fastest of " + ", ".join(f"{n} {v:.3f} s" for n, v in sorted(seconds.items())) + f" ({where})"
    if not cached:
        print(f"attention-seq2seq: onnxruntime will use {best} threads: {reason}", file=sys.stderr)
    return best, reason


def load_onnx(path, *, threads: int | None = None, thread_layout: str | None = None):
    """``(OnnxModel, tokenizer)`` for the export folder ``path``.

    Args:
        threads: CPU cores for translation (default: torch's thread count).
        thread_layout: "auto", "intra" or "inter" (:func:`choose_thread_layout`).

    Raises:
        UserError: onnxruntime is not installed, or the folder cannot be loaded (naming the file).
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
    try:
        spec = read_marker(path)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        generation_config = GenerationConfig.from_pretrained(path)
        threads = threads or torch.get_num_threads()
        layout, reason = choose_thread_layout(path, spec, threads, thread_layout)
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
        if options.constraints is not None:
            raise UserError(
                "--constraints needs the PyTorch model (constrained beam search runs in this package); "
                "an ONNX export cannot take it: use the training run or a --format remote/native export"
            )
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


__all__ = ["OnnxBackend", "OnnxModel", "choose_thread_layout", "load_onnx"]
