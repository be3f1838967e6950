"""Choices measured on the machine at hand, kept per machine so every run decides the same way.

Some speed paths help on one x86 host and hurt on another (CPU bf16 autocast is 1.45x float32 on
an AMD EPYC and 0.68x on one Intel Xeon; CTranslate2's two intra-op threads run 2x *slower* than
one on the 2-core Intel Xeon of 2026-12-02). No instruction-set rule predicts that, so the code
that owns such a path times the alternatives on the machine itself, once, and stores the result
here:

- ``training/precision.py``: ``mixed_precision: auto`` (``mixed_precision.json``);
- ``translation/ct2.py``: CTranslate2's thread layout (``ct2_threads.json``).

Only our own tools (the trainer, the command line) measure: the shipped model files never time,
write or read anything here (a Hub user's ``from_pretrained`` + ``generate`` measures nothing).

A measurement is keyed by what it depends on (the CPU's name, versions, thread count, the
model's shape: the caller's ``key`` fields, hashed) and stored in a small JSON file under
:func:`cache_root`. Processes of one machine share it (a file lock makes one measure while the
others wait). Delete the file, or point ``ATTENTION_SEQ2SEQ_CACHE`` at another folder, to
measure again.

What can go wrong with the store is survived (tests/test_faults.py): an entry that cannot be read
(a file cut in half, another schema, a missing field) is measured again with one warning; a
measurement taken while the machine is busy (its 1-minute load average at or above half its
cores before the timing began, or other processes using a quarter of its cores, at least half
a core, while it ran: :func:`others_busy_cores`) is used for this run only and not kept, with
the reason logged, so a choice made beside a test run or a build is never kept for good
(``ATTENTION_SEQ2SEQ_KEEP_BUSY_MEASUREMENTS=1`` keeps it anyway). Timings are taken by
:func:`settled_medians`: the candidates interleaved, repeated (3 to 9 rounds) until each one's
spread is within :data:`SPREAD_LIMIT`; one that never settles is likewise used and not kept. An
entry kept by an earlier version, before these checks (no ``store_version``), is measured again
once, with a line saying so. A read-only cache folder means nothing is stored, with one warning.

The standard library only; it lives in ``data/`` beside the prepared-corpus cache, which shares
:func:`cache_root`, so every layer from ``data/`` up may use it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

logger = logging.getLogger(__name__)
KEEP_BUSY_ENV = "ATTENTION_SEQ2SEQ_KEEP_BUSY_MEASUREMENTS"
#: Written into every stored entry. Entries of version 1 (no field) were kept before a timing
#: was checked for a busy machine and for its spread, so one may hold a choice taken under load:
#: they are measured again, once, with a line saying so.
STORE_VERSION = 2
#: A timing whose worst relative spread (:func:`relative_spread`) is above this after
#: :data:`MAX_ROUNDS` rounds has not settled: it is used for its run and not kept.
SPREAD_LIMIT = 0.10
#: Interleaved rounds of :func:`settled_medians`: at least ``MIN_ROUNDS``, at most ``MAX_ROUNDS``.
MIN_ROUNDS = 3
MAX_ROUNDS = 9


def cache_root() -> Path:
    """``$ATTENTION_SEQ2SEQ_CACHE``, else ``$XDG_CACHE_HOME`` (or ``~/.cache``) + ``/attention_seq2seq``."""
    root = os.environ.get("ATTENTION_SEQ2SEQ_CACHE")
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention_seq2seq")
    return Path(root)


def _cpuinfo(field: str) -> str | None:
    """The first ``field : value`` of ``/proc/cpuinfo`` (None where the file or field is missing)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where that file does not exist)."""
    return set((_cpuinfo("flags") or "").split())


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def key_of(fields: dict) -> str:
    """A short, stable hash of ``fields`` (JSON with sorted keys; non-JSON values as ``str``)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path.lock`` (processes of one machine measure once, the others wait);
    no lock where the folder cannot be written (then nothing is stored either)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_suffix(".lock"), "w")
    except OSError:
        yield
        return
    with handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: no lock, at worst two processes measure
            pass
        yield


def _read(path: Path) -> tuple[dict, str | None]:
    """``(entries, problem)``: the stored measurements of ``path`` and, where the file exists but
    cannot be used (cut short, not a JSON object), what is wrong with it."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):  # nothing stored (yet)
        return {}, None
    except (OSError, UnicodeDecodeError) as err:
        return {}, f"cannot be read ({type(err).__name__})"
    try:
        entries = json.loads(text)
    except ValueError as err:
        return {}, f"is not valid JSON ({err}; cut short?)"
    if not isinstance(entries, dict):
        return {}, f"holds a JSON {type(entries).__name__}, not an object of measurements"
    return entries, None


def read_entries(path: Path) -> dict:
    """The stored measurements of ``path`` (``{}`` where it is missing or unreadable)."""
    return _read(path)[0]


def machine_busy() -> str | None:
    """Why the machine is too busy for a timing to be kept (its 1-minute load average is at or
    above half its cores, at least 1), or None. None where the load cannot be read."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # pragma: no cover - not POSIX
        return None
    cores = os.cpu_count() or 1
    if load >= max(1.0, cores / 2):
        return f"its load average is {load:.2f} on {cores} cores"
    return None


def cpu_sample() -> tuple[float, float, float] | None:
    """``(busy_s, own_s, wall_s)``: CPU seconds all cores have spent not idle since boot
    (``/proc/stat``: user, nice, system, irq, softirq, steal), CPU seconds of this process (its
    threads and its waited-for children), and a monotonic clock; None where ``/proc/stat`` cannot
    be read (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
        ticks = [int(value) for value in fields[1:9]]
        tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks + [0] * (8 - len(ticks))
    own = os.times()
    return (
        (user + nice + system + irq + softirq + steal) * tick_s,
        own.user + own.system + own.children_user + own.children_system,
        time.monotonic(),
    )


def others_busy_cores(before: tuple | None, after: tuple | None) -> float:
    """How many cores, on average, processes other than this one kept busy between two
    :func:`cpu_sample` readings: (machine busy seconds - this process's CPU seconds) / wall
    seconds; 0 where either reading is missing or no time passed."""
    if before is None or after is None or after[2] <= before[2]:
        return 0.0
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, others) / (after[2] - before[2])


def busy_during(before: tuple | None, after: tuple | None) -> str | None:
    """Why the machine was too busy for the timing between two :func:`cpu_sample` readings to be
    kept (other processes used at least a quarter of its cores, at least half a core), or None."""
    cores = os.cpu_count() or 1
    others = others_busy_cores(before, after)
    if others >= max(0.5, cores / 4):
        return f"other processes used {others:.1f} of its {cores} cores during the timing"
    return None


def relative_spread(times: list[float]) -> float:
    """The spread of repeated timings relative to their median: the median absolute deviation
    over the median (0.05: half the runs lie within 5% of the median). 0 for fewer than two
    timings or a zero median."""
    if len(times) < 2:
        return 0.0
    middle = statistics.median(times)
    if middle <= 0:
        return 0.0
    return statistics.median(abs(t - middle) for t in times) / middle


def settled_medians(
    candidates: dict[str, Callable[[], float]],
    *,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int = MAX_ROUNDS,
    limit: float = SPREAD_LIMIT,
) -> tuple[dict[str, float], float, int]:
    """Time every candidate in interleaved rounds until their timings settle.

    Each round calls every candidate once (``candidates[name]() -> seconds``), in forward order on
    even rounds and reversed on odd ones, so a slow spell of the machine falls on all of them
    alike. After ``min_rounds`` it stops at the first round where every candidate's
    :func:`relative_spread` is at most ``limit``, else after ``max_rounds``.

    Returns:
        ``(medians, spread, rounds)``: the median seconds per candidate, the worst candidate's
        relative spread (above ``limit`` only when ``max_rounds`` did not settle it), and the
        rounds run.
    """
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    rounds = 0
    while rounds < max(1, max_rounds):
        for name in names if rounds % 2 == 0 else reversed(names):
            times[name].append(candidates[name]())
        rounds += 1
        spread = max(relative_spread(t) for t in times.values())
        if rounds >= min_rounds and spread <= limit:
            break
    return {name: statistics.median(t) for name, t in times.items()}, spread, rounds


def unsettled(entry: dict) -> str | None:
    """Why a new measurement must not be kept because its timings did not settle (its ``spread``
    field, if any, above :data:`SPREAD_LIMIT`), or None."""
    spread = entry.get("spread")
    if isinstance(spread, (int, float)) and spread > SPREAD_LIMIT:
        rounds = entry.get("rounds")
        after = f" after {rounds} rounds" if rounds else ""
        return (
            f"its timings did not settle: a spread of {100 * spread:.0f}%{after}, more than {100 * SPREAD_LIMIT:.0f}%"
        )
    return None


def measured(
    file_name: str,
    key: dict,
    measure: Callable[[], dict],
    use_cache: bool = True,
    required: tuple[str, ...] = (),
) -> tuple[dict, bool, Path]:
    """The stored measurement for ``key``, or a new one made by ``measure()`` and stored.

    Args:
        file_name: the JSON file under :func:`cache_root` (one per kind of choice).
        key: what the measurement depends on; hashed with :func:`key_of`.
        measure: ``() -> dict`` of JSON-serialisable results; called only when nothing usable is
            stored.
        use_cache: False: always measure, read and store nothing.
        required: the fields the caller reads: a stored entry without one of them (written by
            another version, or damaged) is measured again with a warning.

    Returns:
        ``(entry, cached, path)``: the results (with ``measured_at``, an ISO date, and the ``cpu``
        added), whether they were read back rather than measured now, and the file. A measurement
        made while the machine is busy (:func:`machine_busy` before it, :func:`busy_during` while
        it ran), whose ``spread`` field says it never settled (:func:`unsettled`), or into a
        folder that cannot be written is returned but not stored (a warning says why). A stored
        entry of an older :data:`STORE_VERSION` is measured again, with a warning.
    """
    path = cache_root() / file_name
    digest = key_of(key)
    with _locked(path) if use_cache else contextlib.nullcontext():
        if use_cache:
            entries, problem = _read(path)
            if problem is not None:
                logger.warning("the measurements file %s %s: measuring again", path, problem)
            entry = entries.get(digest)
            if isinstance(entry, dict) and "measured_at" in entry and entry.get("store_version", 1) < STORE_VERSION:
                logger.warning(
                    "the stored measurement %s in %s (from %s) was kept by an earlier version that did not check "
                    "for a busy machine: measuring again",
                    digest,
                    path,
                    entry["measured_at"],
                )
                entry = None
            if entry is not None:
                missing = [f for f in ("measured_at", *required) if not isinstance(entry, dict) or f not in entry]
                if not missing:
                    return entry, True, path
                logger.warning(
                    "the stored measurement %s in %s lacks %s (another version wrote it, or it is damaged): "
                    "measuring again",
                    digest,
                    path,
                    ", ".join(missing),
                )
        keep_busy = bool(os.environ.get(KEEP_BUSY_ENV))
        busy = None if keep_busy else machine_busy()
        before = cpu_sample()
        entry = {
            **measure(),
            "measured_at": datetime.date.today().isoformat(),
            "cpu": cpu_name(),
            "store_version": STORE_VERSION,
        }
        if busy is None and not keep_busy:
            busy = busy_during(before, cpu_sample())
        if busy is not None:
            busy = f"the machine was busy while measuring: {busy}"
        elif not keep_busy:
            busy = unsettled(entry)
        if not use_cache:
            return entry, False, path
        if busy is not None:
            logger.warning(
                "%s: the choice is used for this run and not kept in %s; "
                "it is measured again next time (set %s=1 to keep it anyway)",
                busy,
                path,
                KEEP_BUSY_ENV,
            )
            return entry, False, path
        entries = read_entries(path)
        entries[digest] = entry
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        try:
            tmp.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)  # readers see the old file or the new one, never half of one
        except OSError as err:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            logger.warning(
                "cannot store the measurement in %s (%s): it is used for this run and measured again next time",
                path,
                err.strerror or type(err).__name__,
            )
    return entry, False, path


__all__ = [
    "busy_during",
    "cache_root",
    "cpu_flags",
    "cpu_name",
    "cpu_sample",
    "key_of",
    "machine_busy",
    "measured",
    "others_busy_cores",
    "read_entries",
    "relative_spread",
    "settled_medians",
    "unsettled",
]
