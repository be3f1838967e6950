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

The standard library only; it lives in ``data/`` beside the prepared-corpus cache, which shares
:func:`cache_root`, so every layer from ``data/`` up may use it.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Callable


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
    """An exclusive lock on ``path.lock`` (processes of one machine measure once, the others wait)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # not POSIX: no lock, at worst two processes measure
            pass
        yield


def read_entries(path: Path) -> dict:
    """The stored measurements of ``path`` (``{}`` where it is missing or unreadable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def measured(file_name: str, key: dict, measure: Callable[[], dict], use_cache: bool = True) -> tuple[dict, bool, Path]:
    """The stored measurement for ``key``, or a new one made by ``measure()`` and stored.

    Args:
        file_name: the JSON file under :func:`cache_root` (one per kind of choice).
        key: what the measurement depends on; hashed with :func:`key_of`.
        measure: ``() -> dict`` of JSON-serialisable results; called only when nothing is stored.
        use_cache: False: always measure, read and store nothing.

    Returns:
        ``(entry, cached, path)``: the results (with ``measured_at``, an ISO date, and the ``cpu``
        added), whether they were read back rather than measured now, and the file.
    """
    path = cache_root() / file_name
    digest = key_of(key)
    with _locked(path) if use_cache else contextlib.nullcontext():
        entry = read_entries(path).get(digest) if use_cache else None
        if entry is not None:
            return entry, True, path
        entry = {**measure(), "measured_at": datetime.date.today().isoformat(), "cpu": cpu_name()}
        if use_cache:
            entries = read_entries(path)
            entries[digest] = entry
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n", encoding="utf-8")
            os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    return entry, False, path


__all__ = ["cache_root", "cpu_flags", "cpu_name", "key_of", "measured", "read_entries"]
