"""Surviving faults: one atomic writer, full disks, one lock, and checked cache entries.

What a long training run or a translation job meets besides its happy path (tests/test_durability.py
and tests/test_resume_after_kill.py make each happen):

- **One atomic writer** (:func:`write_atomically`): a file or a folder is written under a
  temporary name beside its place and renamed into it, so a crash at any moment leaves the old
  whole one or the new whole one, never half of either. Its crash points are the only ones: the
  fault tests set ``ATTENTION_SEQ2SEQ_FAULT_TRACE=FILE`` to list the points a run passes, then
  ``ATTENTION_SEQ2SEQ_FAULT_KILL_AT=NAME`` (or ``..._STOP_AT``) to have the process SIGKILL
  (SIGSTOP) itself at one of them, and check that resuming loses nothing.
- **A full disk** (:func:`out_of_space`, :func:`writing`): ENOSPC, EDQUOT and EFBIG (a file-size
  limit) surface from Python as ``OSError`` but from torch's and safetensors' writers as
  ``RuntimeError`` text; both become one :class:`DiskFullError` line naming the path, the space
  left there and what was kept.
- **One lock** (:func:`exclusive`): an advisory ``flock`` on a lock file that records its holder
  (pid, host, command, start time). The kernel releases it when the holder dies, even by SIGKILL,
  so a stale lock file never blocks anyone; a live holder makes a second writer stop with one
  line naming it (or wait, for a cache entry that another process is building).
- **Checked cache entries** (:func:`write_manifest`, :func:`check_manifest`): a ``MANIFEST.json``
  listing every file's size and SHA-256, written last into an entry before it is renamed into
  place and compared before the entry is used.

The standard library only: every layer uses it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

KILL_AT_ENV = "ATTENTION_SEQ2SEQ_FAULT_KILL_AT"
TRACE_ENV = "ATTENTION_SEQ2SEQ_FAULT_TRACE"
STOP_AT_ENV = "ATTENTION_SEQ2SEQ_FAULT_STOP_AT"
RANK_ENV = "ATTENTION_SEQ2SEQ_FAULT_RANK"  # kill/stop only the process of this global rank
MANIFEST = "MANIFEST.json"
MANIFEST_VERSION = 1


# --------------------------------------------------------------------------------------------
# The atomic writer, and its crash points
# --------------------------------------------------------------------------------------------


def crash_point(name: str) -> None:
    """A place in :func:`write_atomically` where the fault tests may stop this process: SIGKILL (no
    handler, no cleanup) at the first point named ``$ATTENTION_SEQ2SEQ_FAULT_KILL_AT``, SIGSTOP at
    ``$ATTENTION_SEQ2SEQ_FAULT_STOP_AT`` (a test acts on a process caught holding its locks, then
    continues or kills it); ``$ATTENTION_SEQ2SEQ_FAULT_TRACE`` lists the points passed;
    ``$ATTENTION_SEQ2SEQ_FAULT_RANK`` limits the kill or stop to one global rank. Names carry
    the place written ("checkpoints/step_6 renamed"), so one name is one moment of a run, and a
    resumed run that replays to it dies there again."""
    trace, kill_at, stop_at = (os.environ.get(key) for key in (TRACE_ENV, KILL_AT_ENV, STOP_AT_ENV))
    if trace:
        with open(trace, "a", encoding="utf-8") as handle:  # one write(2): survives the kill below
            handle.write(name + "\n")
    if os.environ.get(RANK_ENV) not in (None, os.environ.get("RANK", "0")):
        kill_at = stop_at = None
    if kill_at and kill_at == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if stop_at and stop_at == name:
        os.kill(os.getpid(), signal.SIGSTOP)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_atomically(
    final: str | os.PathLike,
    write: Callable[[Path], None],
    *,
    what: str | None = None,
    needed: int | None = None,
    kept: str | Callable[[], str] = "",
    main: bool = True,
    barrier: Callable[[], None] = lambda: None,
) -> None:
    """Make ``final`` (a file or a folder) whole or not at all: ``write(tmp)`` writes the new one
    at ``.<name>.tmp`` beside it, which is then renamed onto ``final``. A folder already there is
    first set aside as ``.<name>.old`` (a folder cannot be renamed over) and removed once the new
    one is in place; a file is replaced by the rename itself. At every moment ``final`` is absent,
    the old whole one or the new whole one; a temporary left by a killed writer is removed by the
    next one. A full disk is one :class:`DiskFullError` line (:func:`writing`: ``what``, ``needed``
    and ``kept`` as there) and leaves no temporary.

    Several processes writing one folder (each rank's part of a checkpoint) all call it with
    ``barrier`` (waits for all of them): every one runs ``write``, the ``main`` one clears and
    renames.
    """
    final = Path(final)
    tmp, old = final.with_name(f".{final.name}.tmp"), final.with_name(f".{final.name}.old")
    label = f"{final.parent.name}/{final.name}"
    if main:
        _remove(tmp)
        final.parent.mkdir(parents=True, exist_ok=True)
    barrier()
    try:
        with writing(final, what or label, needed=needed, kept=kept):
            write(tmp)
        crash_point(f"{label} written")
        barrier()
        if main:
            if tmp.is_dir() and final.is_dir() and not final.is_symlink():
                _remove(old)
                os.replace(final, old)
                crash_point(f"{label} old copy set aside")
            os.replace(tmp, final)
            crash_point(f"{label} renamed")
            _remove(old)
    except BaseException:
        if main:
            _remove(tmp)  # give the space back; what is in place is untouched
        raise
    barrier()


# --------------------------------------------------------------------------------------------
# A full disk
# --------------------------------------------------------------------------------------------

_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# How torch's zip writer, safetensors (Rust) and numpy word the same errors.
_SPACE_TEXT = ("no space left", "file too large", "disk quota", "os error 28", "os error 27", "os error 122")
# torch.save's zip writer loses the errno ("unexpected pos 576 vs 534", "iostream error"): its
# failures count as a full disk when the place is nearly full or a file-size limit is set.
_TORCH_WRITER_TEXT = ("inline_container", "iostream error", "pytorchstreamwriter", "file write failed")


def _file_size_limit() -> int | None:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        return None if soft == resource.RLIM_INFINITY else soft
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX
        return None


def out_of_space(err: BaseException | None, path: str | os.PathLike | None = None) -> bool:
    """Whether ``err`` (or an exception it was raised from) is a full disk, a quota or a file-size
    limit. With ``path``, a torch writer failure that says nothing counts when fewer than 16 MB are
    free there or a file-size limit is set."""
    seen, torch_failed = set(), False
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        text = str(err).lower()
        if (isinstance(err, OSError) and err.errno in _SPACE_ERRNOS) or any(t in text for t in _SPACE_TEXT):
            return True
        torch_failed = torch_failed or any(t in text for t in _TORCH_WRITER_TEXT)
        err = err.__cause__ or err.__context__
    if path is None or not torch_failed:
        return False
    free = free_bytes(path)
    return _file_size_limit() is not None or (free is not None and free < 16_000_000)


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free to this user on the file system holding ``path`` (its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def size_text(count: int | None) -> str:
    """``12.3 MB``-style size (decimal units)."""
    if count is None:
        return "unknown"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


class DiskFullError(OSError):
    """No space (or a quota, or a file-size limit) while writing; the message is one line naming
    the path, what is free there, what is needed where known, and what was kept."""


@contextlib.contextmanager
def writing(path: str | os.PathLike, what: str, *, needed: int | None = None, kept: str | Callable[[], str] = ""):
    """Turn a full disk inside the block into one :class:`DiskFullError` line.

    Args:
        path: the file or folder being written.
        what: what it is ("checkpoint", "the translations"), the start of the message.
        needed: bytes the write needs, where known (the size of the previous checkpoint, say).
        kept: what is still intact, appended to the message ("the previous checkpoint step_4 is
            intact"), or a function that says it when the disk has filled (what a file holds
            after a write that stopped partway).
    """
    try:
        yield
    except BaseException as err:  # a DiskFullError of an inner block too: the outer one says what and what is kept
        if not out_of_space(err, path):
            raise
        free, soft = free_bytes(path), _file_size_limit()
        limit = f", and a file-size limit of {size_text(soft)} (ulimit -f)" if soft is not None else ""
        need = f"; it needs about {size_text(needed)}" if needed else ""
        kept_text = kept() if callable(kept) else kept
        tail = f"; {kept_text}" if kept_text else ""
        full = DiskFullError(f"no space left writing {what} ({path}: {size_text(free)} free there{limit}{need}){tail}")
        full.errno = errno.ENOSPC
        raise full from err


def tree_bytes(path: str | os.PathLike) -> int:
    """Total size of the files under ``path`` (0 where it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def unwritable(folder: str | os.PathLike) -> str | None:
    """None when files can be created in ``folder`` (made if missing); else why not, in a few
    words ("Read-only file system", "Permission denied"). Root passes permission bits, so
    this tries for real rather than reading them."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return err.strerror or type(err).__name__
    return None


# --------------------------------------------------------------------------------------------
# One lock
# --------------------------------------------------------------------------------------------


class LockedError(RuntimeError):
    """Another live process holds the lock; the message names it."""


@contextlib.contextmanager
def exclusive(lock_file: str | os.PathLike, what: str, *, wait: bool = False):
    """Hold ``lock_file`` (an ``flock``, released by the kernel when this process ends however it
    ends) for the block. A live holder makes it raise :class:`LockedError` at once, naming the
    holder from what the lock file says; with ``wait``, it waits for the holder instead.

    ``what`` names the place in the message ("output folder runs/x", say). The lock file stays on
    disk (removing it would race with a second process opening it); its content is the last
    holder's description. On a system without ``fcntl`` nothing is locked.
    """
    lock_file = Path(lock_file)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            try:
                info = json.loads(holder)
                by = f"process {info['pid']} on {info['host']} (since {info['since']}: {info['command']})"
            except (ValueError, KeyError, TypeError):
                by = "another process"
            raise LockedError(f"{what} is in use by {by}; wait for it to finish or stop it ({lock_file})") from None
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv)[:300],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


# --------------------------------------------------------------------------------------------
# Checked cache entries
# --------------------------------------------------------------------------------------------


def file_sha256(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _entry_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def write_manifest(folder: str | os.PathLike) -> None:
    """Write ``folder/MANIFEST.json``: every file's relative path, size and SHA-256. Call it last,
    on the complete (still temporary) folder."""
    folder = Path(folder)
    files = {str(p.relative_to(folder)): [p.stat().st_size, file_sha256(p)] for p in _entry_files(folder)}
    (folder / MANIFEST).write_text(json.dumps({"version": MANIFEST_VERSION, "files": files}, indent=0) + "\n")


def check_manifest(folder: str | os.PathLike) -> str | None:
    """None when ``folder`` holds exactly the files of its manifest, with their sizes and
    checksums; else what is wrong, in a few words naming the file."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if manifest.get("version") != MANIFEST_VERSION or not isinstance(files, dict):
            return f"{MANIFEST} of another version"
    except FileNotFoundError:
        return f"no {MANIFEST} (written before entries were checked, or never completed)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"an unreadable {MANIFEST} ({type(err).__name__})"
    present = {str(p.relative_to(folder)) for p in _entry_files(folder)}
    for name, (size, sha) in sorted(files.items()):
        path = folder / name
        if name not in present:
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, not {size}"
        if file_sha256(path) != sha:
            return f"{name} does not match its checksum"
    extra = sorted(present - set(files))
    if extra:
        return f"{extra[0]} is not in {MANIFEST}"
    return None
