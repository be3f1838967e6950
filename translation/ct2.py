"""Translate with a CTranslate2 folder written by ``attention-seq2seq export --format ct2``.

The folder holds the CTranslate2 model, our tokenizer and ``generation_config.json``; the
tokenizer turns sentences into token strings (``</s>`` included), ``ctranslate2.Translator``
decodes from ``<s>``, and the tokenizer turns the output tokens back into text. The decoding
options are the ``generate`` keyword arguments the PyTorch path takes (``num_beams``,
``max_new_tokens``, ``length_penalty``, ``num_return_sequences``, sampling), mapped to
CTranslate2's names; defaults come from the folder's ``generation_config.json``.

Threads. CTranslate2 can spend ``threads`` CPU cores two ways: one batch at a time on
``intra_threads = threads`` (OpenMP inside each matrix product), or ``inter_threads = threads``
batches at a time on one core each. Which is faster depends on the host, not only on the model:
on the 2-core Intel Xeon of 2026-12-02 two intra-op threads made int8 greedy decoding of
Multi30k batches 2x *slower* than one thread, and batches of 8 10x slower, while two batches
side by side ran 1.9x faster than one. So ``thread_layout="auto"`` (the default) times both
layouts on this machine, once per CPU, thread count, compute type and model size, and keeps the
answer (:func:`choose_thread_layout`, stored through :mod:`attention_seq2seq.data.host_measurements`).
``ATTENTION_SEQ2SEQ_CT2_THREADS=intra|inter`` fixes the layout instead. On a CPU with AVX-512
the same measurement also picks the instruction set of CTranslate2's kernels (its own choice is
AVX2 on Intel CPUs; ``CT2_FORCE_CPU_ISA``, when set, is kept).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

from ..errors import UserError
from ..data.host_measurements import cpu_flags, cpu_name, measured
from .ct2_folder import MARKER_FILE, is_ct2_folder

BEAM_PATIENCE = 2

#: ``thread_layout`` values: measured, all threads inside one batch, or one thread per batch.
THREAD_LAYOUTS = ("auto", "intra", "inter")
#: The environment variable that fixes the layout (``intra`` or ``inter``) for every load.
THREAD_LAYOUT_ENV = "ATTENTION_SEQ2SEQ_CT2_THREADS"
#: CTranslate2's own variable for its CPU kernels' instruction set; read once per process, at the
#: first Translator. Set by the user, it is kept; otherwise it is set from the measurement.
ISA_ENV = "CT2_FORCE_CPU_ISA"
#: The file under the measurement cache root that keeps the measured settings.
THREAD_LAYOUT_CACHE_FILE = "ct2_threads.json"
#: The timed workload per setting: ``threads x 2`` batches of this many synthetic sentences of
#: ``_PROBE_SOURCE_TOKENS`` tokens, each decoded greedily for exactly ``_PROBE_NEW_TOKENS`` steps
#: (the shape of a Multi30k batch), the layouts alternating, 3 to 9 rounds until the timings
#: settle (``host_measurements.settled_medians``).
_PROBE_BATCH = 32
_PROBE_SOURCE_TOKENS = 20
_PROBE_NEW_TOKENS = 16
#: Another instruction set than CTranslate2's own choice must be at least this much faster.
ISA_MIN_SPEEDUP = 1.03
#: Whether this process has created a CPU Translator (then its instruction set is fixed).
_CPU_TRANSLATOR_MADE = False


@dataclass
class ThreadLayout:
    """How a CPU Translator runs, and why: its threads, and the instruction set of its kernels
    (``isa``: "AVX2"/"AVX512", or None for CTranslate2's own choice)."""

    intra_threads: int
    inter_threads: int
    reason: str
    isa: str | None = None

    @property
    def name(self) -> str:
        return "inter" if self.inter_threads > 1 else "intra"


def _probe_tokens(tokenizer, threads: int) -> list[list[str]]:
    """Synthetic source sentences (token strings of the model's own vocabulary, deterministic)."""
    first = len(tokenizer.all_special_ids) + 1
    span = max(len(tokenizer) - first, 1)
    sentences = []
    for i in range(max(threads, 1) * 2 * _PROBE_BATCH):
        ids = [first + (7919 * i + 104729 * j) % span for j in range(_PROBE_SOURCE_TOKENS)]
        sentences.append(tokenizer.convert_ids_to_tokens(ids) + [tokenizer.eos_token])
    return sentences


# Runs in a fresh process (the instruction set is fixed per process): times the probe workload
# with each thread layout, interleaved until settled, and prints {"seconds": {layout: median}, "spread", "rounds"}.
_PROBE_SCRIPT = r"""
import json, sys, time
import ctranslate2
spec = json.load(open(sys.argv[1], encoding="utf-8"))
threads = spec["threads"]
shapes = {"intra": (threads, 1), "inter": (1, threads)}
translators = {
    name: ctranslate2.Translator(spec["path"], device="cpu", compute_type=spec["compute_type"],
                                 intra_threads=shapes[name][0], inter_threads=shapes[name][1])
    for name in spec["layouts"]
}
options = spec["options"]
sentences = spec["sentences"]
for translator in translators.values():  # warm-up (first-use allocations)
    translator.translate_batch(sentences[: options["max_batch_size"]], **options)
from attention_seq2seq.data.host_measurements import settled_medians
def timer(translator):
    def run():
        start = time.perf_counter()
        translator.translate_batch(sentences, **options)
        return time.perf_counter() - start
    return run
medians, spread, rounds = settled_medians({name: timer(t) for name, t in translators.items()})
print(json.dumps({"seconds": medians, "spread": spread, "rounds": rounds}))
"""


def _time_settings(path: Path, compute_type: str, threads: int, tokenizer, isas: list, layouts: list) -> dict:
    """Seconds of the probe workload for every (instruction set, layout): one fresh process per
    instruction set (a few seconds in all, once per machine and model)."""
    import subprocess
    import sys
    import tempfile

    spec = {
        "path": str(path),
        "compute_type": compute_type,
        "threads": threads,
        "layouts": layouts,
        "sentences": _probe_tokens(tokenizer, threads),
        "options": {
            "max_batch_size": _PROBE_BATCH,
            "beam_size": 1,
            "min_decoding_length": _PROBE_NEW_TOKENS,
            "max_decoding_length": _PROBE_NEW_TOKENS,
        },
    }
    seconds: dict[str, float] = {}
    spread, rounds = 0.0, 0
    with tempfile.TemporaryDirectory(prefix="ct2_probe_") as folder:
        spec_file = Path(folder) / "spec.json"
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        for isa in isas:
            env = {k: v for k, v in os.environ.items() if k != ISA_ENV}
            if isa is not None:
                env[ISA_ENV] = isa
            done = subprocess.run(
                [sys.executable, "-c", _PROBE_SCRIPT, str(spec_file)], env=env, capture_output=True, text=True
            )
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["no output"])[-1]
                raise RuntimeError(f"timing CTranslate2 with {ISA_ENV}={isa}: {last}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            for layout, value in result["seconds"].items():
                seconds[f"{isa or 'default'}/{layout}"] = round(value, 5)
            spread, rounds = max(spread, result["spread"]), max(rounds, result["rounds"])
    return {"seconds": seconds, "spread": round(spread, 4), "rounds": rounds}


def choose_thread_layout(
    path, tokenizer, *, device: str, threads: int, compute_type: str, layout: str | None = None, use_cache: bool = True
) -> ThreadLayout:
    """How a CPU Translator should run on this machine (see the module docstring): the thread
    layout, and on a CPU with AVX-512 also the instruction set of CTranslate2's kernels (it picks
    AVX2 on Intel CPUs by itself; on the 2-core Intel Xeon of 2026-12-02 AVX512 decoded int8 11%
    faster). Every candidate setting is timed on a synthetic workload, in fresh processes, once
    per CPU, CTranslate2 version, thread count, compute type and model size; the fastest is kept.

    Args:
        path: the CTranslate2 folder (its ``model.bin`` size and compute type key the measurement).
        tokenizer: the folder's tokenizer (the probe's sentences are token strings of its vocabulary).
        device: "cpu" or "cuda" (on a GPU: one batch at a time, nothing measured).
        threads: CPU cores to use.
        compute_type: the Translator's compute type.
        layout: "auto" (measured), "intra" or "inter"; None: ``$ATTENTION_SEQ2SEQ_CT2_THREADS``, else "auto".
        use_cache: False: measure anew and store nothing.

    Raises:
        UserError: an unknown layout (named, with the valid ones).
    """
    layout = layout or os.environ.get(THREAD_LAYOUT_ENV) or "auto"
    if layout not in THREAD_LAYOUTS:
        source = f"{THREAD_LAYOUT_ENV}={layout}" if layout == os.environ.get(THREAD_LAYOUT_ENV) else layout
        raise UserError(f"CTranslate2 thread layout {source!r}: use one of {', '.join(THREAD_LAYOUTS)}")
    if device != "cpu":
        return ThreadLayout(threads, 1, "a GPU: one batch at a time")
    layouts = ["intra"] if threads <= 1 else (["intra", "inter"] if layout == "auto" else [layout])
    user_isa = os.environ.get(ISA_ENV)
    # None: CTranslate2's own choice (AVX2 on Intel CPUs); AVX512 only where the CPU has it
    isas = [user_isa or None] if user_isa or "avx512f" not in cpu_flags() else [None, "AVX512"]
    shapes = {"intra": (threads, 1), "inter": (1, threads)}
    if len(layouts) == 1 and len(isas) == 1:
        why = "one thread" if threads <= 1 else f"{layout} (asked for)"
        return ThreadLayout(*shapes[layouts[0]], why, isas[0])
    import ctranslate2

    path = Path(path)
    key = {
        "cpu": cpu_name(),
        "ctranslate2": ctranslate2.__version__,
        "threads": threads,
        "compute_type": compute_type,
        "model_bytes": (path / "model.bin").stat().st_size,
        "isas": isas,
        "layouts": layouts,
    }

    def measure() -> dict:
        print(
            "attention-seq2seq: timing CTranslate2's thread layout and instruction set on this machine "
            "(once per machine and model size, a few seconds)",
            file=sys.stderr,
        )
        return _time_settings(path, compute_type, threads, tokenizer, isas, layouts)

    entry, cached, store = measured(THREAD_LAYOUT_CACHE_FILE, key, measure, use_cache=use_cache, required=("seconds",))
    seconds = entry["seconds"]
    isa, best_layout = min(seconds, key=seconds.get).split("/")
    default = f"{isas[0] or 'default'}/{best_layout}"
    if seconds[f"{isa}/{best_layout}"] > seconds[default] / ISA_MIN_SPEEDUP:
        isa = isas[0] or "default"  # another instruction set only for a clear gain, not for noise
    where = f"kept in {store} from {entry['measured_at']}" if cached else "measured now"
    timings = ", ".join(f"{name} {value:.3f} s" for name, value in sorted(seconds.items()))
    reason = f"fastest of {timings} ({where})"
    if not cached:
        chosen = f"{best_layout} threads, {'its own' if isa == 'default' else isa} kernels"
        print(f"attention-seq2seq: CTranslate2 will use {chosen}: {reason}", file=sys.stderr)
    return ThreadLayout(*shapes[best_layout], reason, None if isa == "default" else isa)


def _use_isa(isa: str | None) -> None:
    """Make CTranslate2 use ``isa`` in this process, if no CPU Translator has fixed it yet."""
    import logging

    if isa is None or os.environ.get(ISA_ENV) == isa:
        return
    if _CPU_TRANSLATOR_MADE:
        logging.getLogger(__name__).warning(
            "CTranslate2 would run faster here with %s=%s, but this process already fixed its instruction set",
            ISA_ENV,
            isa,
        )
        return
    os.environ[ISA_ENV] = isa


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
        thread_layout: "auto", "intra" or "inter" (:func:`choose_thread_layout`; None: the
            environment variable ``ATTENTION_SEQ2SEQ_CT2_THREADS``, else "auto"). The choice is
            in ``model.thread_layout``.

    Raises:
        UserError: ctranslate2 is not installed, or the folder cannot be loaded.
    """
    global _CPU_TRANSLATOR_MADE
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
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        generation_config = GenerationConfig.from_pretrained(path)
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
        layout = choose_thread_layout(
            path,
            tokenizer,
            device=device,
            threads=threads or torch.get_num_threads(),
            compute_type=compute_type,
            layout=thread_layout,
        )
        if device == "cpu":
            _use_isa(layout.isa)
            _CPU_TRANSLATOR_MADE = True
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
        if options.constraints is not None:
            raise UserError(
                "--constraints needs the PyTorch model (constrained beam search runs in this package); "
                "a CTranslate2 folder cannot take it: use the training run or a --format remote/native export"
            )
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
    "choose_thread_layout",
    "ct2_options",
    "is_ct2_folder",
    "load_ct2",
    "translate_ct2",
]
