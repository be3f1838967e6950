"""The files a command is told to read or write, checked before anything is read or written.

A command (translate, evaluate, train) calls :func:`check_input_file` on each file it reads and
:func:`check_output_file` on each it writes *before* it loads a model or truncates an output, so
that a mistake (a folder for a file, an output that is also an input, a read-only folder) is one
line naming the option and what would be valid, and no file is lost or left half written.
"""

from __future__ import annotations

import errno
import os
import re
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
    if str(path) in ("", "-"):
        raise UserError(f"{option} {str(path) or repr('')}: give a file name{hint}")
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
    # os.path.realpath, not Path.resolve: a symbolic link loop is a path like any other here
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links
    except OSError:
        return False


# Names that are this process's own streams whatever they point at: /dev/stdout is a link to
# /proc/self/fd/1, which is the terminal, a pipe or the file the shell redirected stdout to.
_STREAM_NAMES = re.compile(r"/dev/(stdout|stderr|fd/\d+)|/proc/(self|thread-self|\d+)/fd/\d+")


def is_stream(path: str | os.PathLike) -> bool:
    """True when ``path`` is written to as a stream: appended to, never emptied, replaced by a
    rename, locked or fsync'd.

    That is a device (``/dev/null``, ``/dev/full``, a terminal), a named pipe or socket, and
    ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N`` or ``/proc/self/fd/N`` (or a link to one)
    whatever they lead to: ``-o /dev/stdout > out.txt`` appends to ``out.txt`` like a plain
    ``> out.txt`` would, rather than emptying the file the shell opened.
    """
    name = os.path.abspath(path)
    for _ in range(8):  # follow a link to /dev/stdout by name: its target is a magic link
        if _STREAM_NAMES.fullmatch(name):
            return True
        try:
            target = os.readlink(name)
        except OSError:
            break
        name = os.path.normpath(os.path.join(os.path.dirname(name), target))
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _path_fault(err: OSError, option: str, path) -> UserError:
    """One line for a path that cannot even be looked up (a link loop, a name too long)."""
    if err.errno == errno.ELOOP:
        return UserError(f"{option} {path} is a symbolic link that leads back to itself; give a file name")
    if err.errno == errno.ENAMETOOLONG:
        return UserError(
            f"{option}: the name is too long for the file system ({len(str(path))} characters); choose a shorter one"
        )
    if err.errno == errno.ENOTDIR:
        return UserError(f"{option} {path}: a folder on the way is a file; choose another place")
    return UserError(f"{option} {path}: {err.strerror or type(err).__name__}")


def check_output_file(
    path: str | os.PathLike, option: str, *, inputs: Mapping[str, str | os.PathLike | None] | None = None
) -> Path:
    """``path`` as a :class:`Path` when this process can write it without harming an input.

    ``inputs``: ``{option: path}`` of the files the command reads or writes besides this one
    (``None`` values are skipped); ``path`` may be none of them. A stream (:func:`is_stream`:
    ``/dev/null``, ``/dev/stdout``, a named pipe) is accepted as it is and counts as no file, so
    two outputs may both be ``/dev/null``. Nothing is created or changed: a missing folder is
    checked at its nearest existing parent (the command makes it later); a symbolic link that
    leads nowhere yet is checked where it leads.

    Raises:
        UserError: an empty name, ``-``, a folder, a path that is one of ``inputs``, a link loop,
            a name too long, a parent that is a file, or a place this process cannot write
            (read-only file system, permissions), as one line naming ``option`` and what would
            be valid.
    """
    if str(path) == "":
        raise UserError(f"{option} '': give a file name (leave out {option} to write to standard output)")
    if str(path) == "-":
        raise UserError(f"{option} -: give a file name (leave out {option} to write to standard output)")
    file = Path(path)
    if is_stream(file):
        return file
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        mode = None  # not there yet, or a link to a file not there yet
    except OSError as err:
        raise _path_fault(err, option, path) from None
    for other, value in (inputs or {}).items():
        if value is not None and str(value) not in ("", "-") and not is_stream(value) and _same_file(file, Path(value)):
            raise UserError(f"{option} is the {other} file ({path}); choose another file")
    if mode is not None:
        if stat.S_ISDIR(mode):
            raise UserError(f"{option} {path} is a folder; give a file name, e.g. {file / 'out.txt'}")
        if not stat.S_ISREG(mode):
            raise UserError(f"{option} {path} is {_kind(mode)}; give a file name")
    if mode is None and file.is_symlink():  # written through: the file is made where the link leads
        target = Path(os.path.realpath(file))
        if not target.parent.is_dir():
            raise UserError(
                f"{option} {path} is a symbolic link to {target}, whose folder {target.parent} does not exist; "
                "make the folder or give another file name"
            )
        folder = target.parent
    else:
        folder = file.absolute().parent
        try:
            while not folder.exists():
                folder = folder.parent
        except OSError as err:
            raise _path_fault(err, option, path) from None
        if not folder.is_dir():
            raise UserError(f"{option} {path}: {folder} is a file, not a folder; choose another place")
    why = unwritable(folder)
    if why is None and mode is not None:
        try:
            with open(file, "ab"):
                pass
        except OSError as err:
            why = err.strerror or type(err).__name__
    if why is not None:
        raise UserError(f"{option} {path}: cannot write there ({why}); choose another place")
    return file


def write_whole(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) as the whole of ``path``: through a temporary file beside it and a
    rename, so a crash or a full disk leaves the old file whole, never half a new one; a stream
    (:func:`is_stream`) is written to as it is. The temporary file is removed on failure.
    """
    path = Path(path)
    if is_stream(path):
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(text)
        return
    if path.is_symlink():  # replace the file the link leads to, keep the link
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else None
        with open(temporary, "w", encoding="utf-8") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)  # the old file's permissions
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
