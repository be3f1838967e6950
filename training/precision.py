"""``mixed_precision: auto``: train in bf16 only where it is measured to be faster.

CPU bf16 autocast is a gamble that depends on the host, not on the model alone. On an AMD EPYC
(Zen 4, AVX512-BF16) the Transformer-small step ran 1.45x faster in bf16; on a 2-core Intel Xeon
with AVX512-BF16 it ran at 0.68x, and on a Xeon with AMX (2026-12-02) the main job's Transformer
step ran 2.0x faster and its LSTM step 1.7x (warm steps; a cold 40-update probe had put the LSTM
at 0.87x, its first updates setting up bf16 kernels for each new shape). No instruction-set rule
predicts all of that, so ``auto`` times the model's own warm training step on the machine at hand.

How the decision is made (:func:`resolve_mixed_precision`):

1. A GPU: ``bf16`` where CUDA supports it, else ``no`` (fp16 needs loss scaling: ask for it).
2. A CPU without bf16 instructions (no ``avx512_bf16`` / ``amx_bf16`` in ``/proc/cpuinfo``):
   ``no`` (autocast would emulate bf16 in software); only the float32 step is timed, for the
   time estimate.
3. Otherwise :func:`measure_step_times` runs the model's forward, backward and optimizer update
   on padded synthetic batches of the run's size (short, middle and long sentences), float32 and
   bf16 *interleaved* (f, b, b, f, ...), for at least 3 rounds and more (up to 9) until the
   timings' spread is within 10%, and compares the mean step times. Load from other processes
   slows both halves of each pair alike, so the ratio does not follow the machine's load; a
   timing taken on a busy machine or that never settled is used for its run only, never kept
   (:mod:`attention_seq2seq.data.host_measurements`). bf16 is chosen when it is at least
   :data:`BF16_MIN_SPEEDUP` times as fast; nearer than that, float32 keeps its precision.
4. The measurement is kept in a small JSON file (:func:`cache_path`, through
   :mod:`attention_seq2seq.data.host_measurements`), keyed by the CPU, torch
   version, thread count and the model's shape, so the same command on the same machine takes
   the same decision every time (bit-identical runs), and ranks of one machine share it. Delete
   the file, or set ``ATTENTION_SEQ2SEQ_CACHE`` to another folder, to measure again.

Either choice trains the same model up to rounding: the same updates, the same data order, float32
weights and optimizer state (autocast only lowers the matmuls), so the same number of updates
gives the same quality within noise; only the time differs.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from ..data.host_measurements import MAX_ROUNDS, cache_root, cpu_flags, cpu_name, measured, settled_medians

logger = logging.getLogger("attention_seq2seq.training")

#: bf16 must make the training step at least this much faster to be chosen.
BF16_MIN_SPEEDUP = 1.10
#: Padded lengths, in tokens, of the synthetic batches: a token-budget batch of long sentences
#: costs more than one of short ones with the same tokens (an RNN steps through every position),
#: so the step time is the mean over short, middle and long batches.
SYNTHETIC_LENGTHS = (16, 32, 64)
#: The file under the cache root that keeps the measurements.
CACHE_FILE = "mixed_precision.json"


@dataclass
class PrecisionChoice:
    """What ``auto`` decided and why.

    Attributes:
        mixed_precision: ``"bf16"`` or ``"no"``.
        reason: one human-readable sentence (logged, and stored in metrics.json).
        float32_step_s / bf16_step_s: median seconds of one synthetic training step, or None
            where nothing was measured.
        measured_at: ISO date of the measurement (an older one came from the cache file).
        cached: True when read back from :func:`cache_path` rather than measured now.
    """

    mixed_precision: str
    reason: str
    float32_step_s: float | None = None
    bf16_step_s: float | None = None
    measured_at: str | None = None
    cached: bool = False

    @property
    def step_s(self) -> float | None:
        """Seconds of one synthetic step in the chosen precision (None if not measured)."""
        return self.bf16_step_s if self.mixed_precision == "bf16" else self.float32_step_s

    def to_dict(self) -> dict:
        return asdict(self)


def cpu_has_bf16() -> bool:
    """True where the CPU has bf16 dot-product instructions (AVX512-BF16 or AMX-BF16).

    Without ``/proc/cpuinfo`` (not Linux) nothing is known, and the step is measured anyway."""
    flags = cpu_flags()
    return not flags or bool({"avx512_bf16", "amx_bf16"} & flags)


def cache_path() -> Path:
    """``$ATTENTION_SEQ2SEQ_CACHE/mixed_precision.json``, else ``$XDG_CACHE_HOME`` or ``~/.cache``
    ``/attention_seq2seq/mixed_precision.json`` (:func:`~attention_seq2seq.data.host_measurements.cache_root`)."""
    return cache_root() / CACHE_FILE


def cache_key(family: str, model_config: dict, vocab_size: int, max_tokens: int) -> dict:
    """What the measurement depends on: host CPU, torch, threads, the model's shape, the batch size."""
    return {
        "cpu": cpu_name(),
        "bf16_flags": sorted({"avx512_bf16", "amx_bf16"} & cpu_flags()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "family": family,
        "model_config": model_config,
        "vocab_size": vocab_size,
        "max_tokens": max_tokens,
    }


def synthetic_batch(vocab_size: int, max_tokens: int, length: int) -> dict[str, torch.Tensor]:
    """A padded training batch as the token-budget sampler makes them: ``max_tokens // length``
    pairs padded to ``length`` tokens, each side of each pair between half that and all of it.

    Returns ``input_ids``, ``attention_mask``, ``decoder_input_ids``, ``labels`` (-100 on
    padding), each (batch, length). The ids are drawn from a private generator (ids 4 and up: no
    special tokens), so the global random state, which seeds the real run, is untouched.
    """
    generator = torch.Generator().manual_seed(length)
    batch = max(1, max_tokens // length)
    high = max(5, vocab_size)
    ids = torch.randint(4, high, (batch, length), generator=generator)
    labels = torch.randint(4, high, (batch, length), generator=generator)
    positions = torch.arange(length)
    source_lengths = torch.randint((length + 1) // 2, length + 1, (batch,), generator=generator)
    target_lengths = torch.randint((length + 1) // 2, length + 1, (batch,), generator=generator)
    source_lengths[0] = target_lengths[0] = length  # the longest pair sets the padded length
    attention_mask = (positions < source_lengths[:, None]).long()
    target_mask = positions < target_lengths[:, None]
    ids = ids.masked_fill(attention_mask == 0, 0)
    labels = labels.masked_fill(~target_mask, -100)
    # as the trainer's Collate does it: labels shifted right behind the start id, padding 0
    decoder_input_ids = torch.cat([labels.new_full((batch, 1), 1), labels[:, :-1].clamp(min=0)], dim=1)
    return {
        "input_ids": ids,
        "attention_mask": attention_mask,
        "decoder_input_ids": decoder_input_ids,
        "labels": labels,
    }


class StepTimes(NamedTuple):
    """What :func:`measure_step_times` measured: seconds per training step, the worst relative
    spread of the timings (:func:`~attention_seq2seq.data.host_measurements.relative_spread`)
    and the most rounds one batch needed to settle."""

    float32_s: float
    bf16_s: float | None
    spread: float = 0.0
    rounds: int = 0


def measure_step_times(
    model: torch.nn.Module, batches: list[dict[str, torch.Tensor]], max_rounds: int = MAX_ROUNDS, bf16: bool = True
) -> StepTimes:
    """Seconds of one training step (forward, summed token loss, backward, AdamW update) in
    float32 and in CPU bf16 autocast: for each batch the median of interleaved timed steps (f, b,
    b, f, ...: :func:`~attention_seq2seq.data.host_measurements.settled_medians`, at least
    3 rounds, more until their spread is within 10%, at most ``max_rounds``), then the mean over
    the batches.

    ``model`` is trained by this (its weights change): pass a throw-away copy.

    Returns:
        :class:`StepTimes`; its ``bf16_s`` is None when ``bf16`` is False.
    """
    from .objectives import token_loss_sum

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(batch: dict, bf16: bool) -> float:
        start = time.perf_counter()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False).logits
        loss = token_loss_sum(logits, batch["labels"], 0.1, model.config)  # the trainer's loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    modes = {"float32": False, "bf16": True} if bf16 else {"float32": False}
    means: dict[str, list[float]] = {name: [] for name in modes}
    spread, rounds = 0.0, 0
    for batch in batches:
        for mode in modes.values():  # untimed: first calls pay for allocation and kernel selection
            step(batch, mode)
        candidates = {name: (lambda mode=mode: step(batch, mode)) for name, mode in modes.items()}
        medians, batch_spread, batch_rounds = settled_medians(candidates, max_rounds=max_rounds)
        spread, rounds = max(spread, batch_spread), max(rounds, batch_rounds)
        for name in modes:
            means[name].append(medians[name])
    return StepTimes(
        statistics.fmean(means["float32"]), statistics.fmean(means["bf16"]) if bf16 else None, spread, rounds
    )


def resolve_mixed_precision(
    family: str, model_config: dict, vocab_size: int, max_tokens: int, build_model=None, use_cache: bool = True
) -> PrecisionChoice:
    """Decide ``auto``: ``"bf16"`` or ``"no"`` for this model on this machine (see the module docstring).

    Args:
        family: ``"rnn"`` or ``"transformer"``.
        model_config: the run's ``model_config`` (the model's shape).
        vocab_size: the run's ``vocab_size`` (the synthetic model's vocabulary).
        max_tokens: the micro-batch token budget (the synthetic batch's size).
        build_model: ``callable() -> model`` of a throw-away model with the run's shape; the
            measurement trains it. Needed only when a measurement runs. The global random state
            is the same afterwards as before.
        use_cache: read and write :func:`cache_path` (False: always measure, store nothing).

    Returns:
        A :class:`PrecisionChoice`.
    """
    if torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", "a CUDA GPU that supports bf16")
        return PrecisionChoice(
            "no", "a CUDA GPU without bf16 (fp16 needs loss scaling: pass --mixed_precision fp16 for it)"
        )
    with_bf16 = cpu_has_bf16()

    def measure() -> dict:
        with torch.random.fork_rng(devices=[]):  # initialisation and dropout must not move the run's seed
            model = build_model()
            batches = [synthetic_batch(vocab_size, max_tokens, length) for length in SYNTHETIC_LENGTHS]
            times = measure_step_times(model, batches, bf16=with_bf16)
            del model
        return {
            "float32_step_s": round(times.float32_s, 5),
            "bf16_step_s": None if times.bf16_s is None else round(times.bf16_s, 5),
            "threads": torch.get_num_threads(),
            "spread": round(times.spread, 4),
            "rounds": times.rounds,
        }

    key = cache_key(family, model_config, vocab_size, max_tokens)
    entry, cached, path = measured(
        CACHE_FILE, key, measure, use_cache=use_cache, required=("float32_step_s", "bf16_step_s")
    )
    where = f"kept in {path} from {entry['measured_at']}" if cached else "measured now"
    if entry["bf16_step_s"] is None:
        reason = (
            f"this CPU has no bf16 instructions (neither avx512_bf16 nor amx_bf16); one float32 training step "
            f"takes {1000 * entry['float32_step_s']:.0f} ms ({where})"
        )
        return PrecisionChoice("no", reason, entry["float32_step_s"], None, entry["measured_at"], cached)
    speedup = entry["float32_step_s"] / entry["bf16_step_s"]
    choice = "bf16" if speedup >= BF16_MIN_SPEEDUP - 1e-9 else "no"  # (tolerance: the cache rounds to 10 µs)
    reason = (
        f"one training step takes {1000 * entry['float32_step_s']:.0f} ms in float32 "
        f"and {1000 * entry['bf16_step_s']:.0f} ms "
        f"in bf16 ({speedup:.2f}x; bf16 needs {BF16_MIN_SPEEDUP:.2f}x; {where})"
    )
    return PrecisionChoice(choice, reason, entry["float32_step_s"], entry["bf16_step_s"], entry["measured_at"], cached)
