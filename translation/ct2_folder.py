"""What makes a folder a CTranslate2 export of this package (written by ``export --format ct2``,
read by ``translate``/``evaluate``): the standard library only, so detecting a folder costs nothing."""

from __future__ import annotations

from pathlib import Path

MARKER_FILE = "attention_seq2seq_ct2.json"  # our settings beside CTranslate2's model.bin (start token, patience, ...)


def is_ct2_folder(path) -> bool:
    """A folder written by ``export --format ct2``: ``model.bin`` next to ``attention_seq2seq_ct2.json``."""
    path = Path(path)
    return path.is_dir() and (path / "model.bin").is_file() and (path / MARKER_FILE).is_file()
