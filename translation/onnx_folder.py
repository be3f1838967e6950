"""What makes a folder an ONNX export of this package (written by ``export --format onnx``, read by
``translate``/``evaluate``): the standard library only, so detecting a folder costs nothing."""

from __future__ import annotations

import json
from pathlib import Path

MARKER_FILE = "attention_seq2seq_onnx.json"  # the graphs' interface and decoding defaults
FORMAT_VERSION = 1


def is_onnx_folder(path) -> bool:
    """A folder written by ``export --format onnx``: ``attention_seq2seq_onnx.json`` beside the graphs."""
    path = Path(path)
    return path.is_dir() and (path / MARKER_FILE).is_file()


def looks_like_foreign_onnx(path) -> bool:
    """A folder with ``.onnx`` files but without our marker (Optimum's or another tool's export)."""
    path = Path(path)
    return path.is_dir() and not (path / MARKER_FILE).is_file() and any(path.glob("*.onnx"))


def read_marker(path) -> dict:
    """The folder's ``attention_seq2seq_onnx.json``.

    Raises:
        ValueError: unreadable, or written by a newer format version (the message names the file).
    """
    marker = Path(path) / MARKER_FILE
    try:
        spec = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{marker}: not a readable ONNX export description ({error})") from None
    if not isinstance(spec, dict) or spec.get("format") != "onnx" or "interface" not in spec:
        raise ValueError(f"{marker}: not written by `attention-seq2seq export --format onnx`")
    if spec.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{marker}: format_version {spec['format_version']} is newer than this package reads "
            f"({FORMAT_VERSION}); upgrade attention-seq2seq"
        )
    return spec
