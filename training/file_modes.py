"""File modes of what the package writes.

safetensors (under ``accelerator.save_state``, ``accelerator.save_model`` and ``save_averaged``)
creates its files with mode 0600; every other file of a run gets 0666 less the process's umask
(0644 under the usual 022), as ``open()`` gives it. `give_ordinary_modes` puts a file, or every file
under a folder, at that mode after it has been written.
"""

from __future__ import annotations

import os
from pathlib import Path


def current_umask() -> int:
    """The process's umask (read from /proc where it can be, else by setting and restoring it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def give_ordinary_modes(path: str | Path) -> None:
    """Give ``path`` (a file), or every file under it (a folder), the mode ``open()`` gives new files."""
    path = Path(path)
    mode = 0o666 & ~current_umask()
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    for file in files:
        try:
            if file.stat().st_mode & 0o777 != mode:
                os.chmod(file, mode)
        except FileNotFoundError:  # removed meanwhile
            pass
