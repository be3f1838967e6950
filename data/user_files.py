"""The files a command is told to read or write, checked before anything is read or written.

A command (translate, evaluate, train) calls :func:`check_input_file` on each file it reads and
:func:`check_output_file` on each it writes *before* it loads a model or truncates an output, so
that a mistake (a folder for a file, an output that is also an input, a read-only folder) is one
line naming the option and what would be valid, and no file is lost or left half written.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from attention_seq2seq.errors import UserError

from .durability import unwritable


def _kind(mode: int) -> str:
    """What a path that is not a regular file is, in a few words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_input_file(path: str | os.PathLike, option: str, *, stdin_hint: bool = False) -> Path:
    """``path`` as a :class:`Path` when it is a regular file this process can read.

    ``stdin_hint``: the command reads standard input when ``option`` is left out, and the
    message for ``-``, a pipe or a device says so.

    Raises:
        UserError: ``-``, a missing path, a folder, a pipe or device, or an unreadable file, as
            one line naming ``option``, the path and what would be valid.
    """
    hint = f"; to read standard input, leave out {option} and pipe the file in" if stdin_hint else ""
    if str(path) == "-":
        raise UserError(f"{option} -: give a file name{hint}")
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{option}: file not found: {path}") from None
    except OSError as err:
        raise UserError(f"{option} {path}: {err.strerror or type(err).__name__}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{option} {path} is a folder; give a text file, one sentence per line")
    if not stat.S_ISREG(mode):
        raise UserError(f"{option} {path} is {_kind(mode)}, not a file; give a text file, one sentence per line{hint}")
    try:
        with open(file, "rb"):
            pass
    except OSError as err:
        raise UserError(f"{option} {path}: cannot read it ({err.strerror or type(err).__name__})") from None
    return file


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)  # hard links
    except OSError:
        return False


def check_output_file(
    path: str | os.PathLike, option: str, *, inputs: Mapping[str, str | os.PathLike | None] | None = None
) -> Path:
    """``path`` as a :class:`Path` when this process can write it without harming an input.

    ``inputs``: ``{option: path}`` of the files the command reads or writes besides this one
    (``None`` values are skipped); ``path`` may be none of them. A character device
    (``/dev/null``, ``/dev/stdout``) is accepted. Nothing is created or changed: a missing folder
    is checked at its nearest existing parent (the command makes it later).

    Raises:
        UserError: ``-``, a folder, a pipe, a path that is one of ``inputs``, a parent that is a
            file, or a place this process cannot write (read-only file system, permissions), as
            one line naming ``option`` and what would be valid.
    """
    if str(path) == "-":
        raise UserError(f"{option} -: give a file name (leave out {option} to write to standard output)")
    file = Path(path)
    for other, value in (inputs or {}).items():
        if value is not None and str(value) != "-" and _same_file(file, Path(value)):
            raise UserError(f"{option} is the {other} file ({path}); choose another file")
    if file.exists():
        mode = file.stat().st_mode
        if stat.S_ISDIR(mode):
            raise UserError(f"{option} {path} is a folder; give a file name, e.g. {file / 'out.txt'}")
        if stat.S_ISCHR(mode):
            return file
        if not stat.S_ISREG(mode):
            raise UserError(f"{option} {path} is {_kind(mode)}; give a file name")
    folder = file.absolute().parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"{option} {path}: {folder} is a file, not a folder; choose another place")
    why = unwritable(folder)
    if why is None and file.exists():
        try:
            with open(file, "ab"):
                pass
        except OSError as err:
            why = err.strerror or type(err).__name__
    if why is not None:
        raise UserError(f"{option} {path}: cannot write there ({why}); choose another place")
    return file
