"""The files a command is told to read or write, checked before anything is read or written.

A command (translate, evaluate, train) calls :func:`check_input_file` on each file it reads and
:func:`check_output_file` on each it writes *before* it loads a model or truncates an output, so
that a mistake (a folder for a file, an output that is also an input, a read-only folder) is one
line naming the option and what would be valid, and no file is lost or left half written.

An output that exists and is not a regular file (:func:`is_stream`: ``/dev/null``, a terminal, a
pipe) is simply written to: never emptied, replaced, locked or resumed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from .errors import UserError

from .durability import unwritable, write_atomically


def is_stream(path: str | os.PathLike) -> bool:
    """True when ``path`` exists and is neither a regular file nor a folder (a device, a pipe, a
    socket): written to as it is, never emptied, replaced, locked or resumed."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_input_file(path: str | os.PathLike, option: str, *, stdin_hint: bool = False) -> Path:
    """``path`` as a :class:`Path` when it is a regular file this process can read.

    ``stdin_hint``: the command reads standard input when ``option`` is left out, and the
    message for ``-``, a pipe or a device says so.

    Raises:
        UserError: ``-``, a missing path, a folder, a pipe or device, or an unreadable file, as
            one line naming ``option``, the path and what would be valid.
    """
    hint = f"; to read standard input, leave out {option} and pipe the file in" if stdin_hint else ""
    if str(path) in ("", "-"):
        raise UserError(f"{option} {str(path) or repr('')}: give a file name{hint}")
    file = Path(path)
    try:
        mode = file.stat().st_mode  # before opening: opening a named pipe waits for its writer
        if stat.S_ISDIR(mode):
            raise UserError(f"{option} {path} is a folder; give a text file, one sentence per line")
        if not stat.S_ISREG(mode):
            raise UserError(f"{option} {path} is not a regular file; give a text file, one sentence per line{hint}")
        with open(file, "rb"):
            pass
    except FileNotFoundError:
        raise UserError(f"{option}: file not found: {path}") from None
    except OSError as err:
        raise UserError(f"{option} {path}: cannot read it ({err.strerror or type(err).__name__})") from None
    return file


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)  # samefile: hard links
    except OSError:
        return False


def check_output_file(
    path: str | os.PathLike, option: str, *, inputs: Mapping[str, str | os.PathLike | None] | None = None
) -> Path:
    """``path`` as a :class:`Path` when this process can write it without harming an input.

    ``inputs``: ``{option: path}`` of the files the command reads or writes besides this one
    (``None`` values are skipped); ``path`` may be none of them. A stream (:func:`is_stream`) is
    accepted as it is and counts as no file, so two outputs may both be ``/dev/null``. Nothing is
    created or changed: a missing folder is checked at its nearest existing parent (the command
    makes it later); a symbolic link is checked where it leads.

    Raises:
        UserError: an empty name, ``-``, a folder, a path that is one of ``inputs``, a name the
            system refuses (a link loop, a name too long), or a place this process cannot write
            (read-only file system, permissions), as one line naming ``option`` and what would
            be valid.
    """
    if str(path) in ("", "-"):
        name = str(path) or repr("")
        raise UserError(f"{option} {name}: give a file name (leave out {option} to write to standard output)")
    file = Path(path)
    if is_stream(file):
        return file
    for other, value in (inputs or {}).items():
        if value is not None and str(value) not in ("", "-") and not is_stream(value) and _same_file(file, Path(value)):
            raise UserError(f"{option} is the {other} file ({path}); choose another file")
    try:
        try:
            file.stat()  # a link loop: one line below
        except FileNotFoundError:  # not there yet (through a link too: written where it leads)
            pass
        if file.is_dir():
            raise UserError(f"{option} {path} is a folder; give a file name, e.g. {file / 'out.txt'}")
        folder = Path(os.path.realpath(file)).parent  # a link is written through, where it leads
        while not folder.exists():
            folder = folder.parent
        why = unwritable(folder) if folder.is_dir() else f"{folder} is a file, not a folder"
        if why is None and file.exists():
            with open(file, "ab"):
                pass
    except OSError as err:
        why = err.strerror or type(err).__name__
    if why is not None:
        raise UserError(f"{option} {path}: cannot write there ({why}); choose another place")
    return file


def write_whole(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) as the whole of ``path`` through the atomic writer
    (:func:`~.durability.write_atomically`), so a crash or a full disk leaves the old file whole,
    never half a new one; the old file's permissions are kept, and a link stays a link (the file
    it leads to is replaced). A stream (:func:`is_stream`) is written to as it is.
    """
    if is_stream(path):
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)
        return
    path = Path(os.path.realpath(path))
    mode = stat.S_IMODE(path.stat().st_mode) if path.is_file() else None

    def write(temporary: Path) -> None:
        with open(temporary, "w", encoding="utf-8") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)  # the old file's permissions
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    write_atomically(path, write)
