"""What names a corpus and what describes a loaded one: :class:`CorpusSpec` (the spec string's
grammar is in ``corpora.py``), :class:`CorpusInfo`, :class:`CorpusError`, and the kinds with their
options. The readers (``corpora.py``, ``bible.py``) both import from here, never from each other
at import time."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from attention_seq2seq.common.errors import UserError

from .presets import PRESETS

SPLITS = ("train", "validation", "test")
_METADATA_OPTIONS = ("name", "license", "attribution")  # for the model card; override the defaults
_COMMON_OPTIONS = ("train", "validation", "test", "holdout", "seed") + _METADATA_OPTIONS

# The generic file formats and the options each takes; corpora.py has one reader per format.
# A new format is an entry here and its reader there.
FORMAT_OPTIONS = {
    "text": _COMMON_OPTIONS,
    "tsv": _COMMON_OPTIONS + ("src_col", "tgt_col", "header"),
    "jsonl": _COMMON_OPTIONS + ("src_key", "tgt_key"),
    "hf": _COMMON_OPTIONS + ("config", "src_key", "tgt_key", "field"),
}


def kind_options() -> dict[str, tuple[str, ...]]:
    """Every spec kind and the options it takes: the presets of data/presets.py first (each with
    the common options of its format; the Bible: its modules), then the formats. Read from the
    tables at each call, so a preset added to ``PRESETS`` is a kind at once."""
    presets = {
        kind: ("src", "tgt") if preset.format == "bible" else _COMMON_OPTIONS for kind, preset in PRESETS.items()
    }
    return {**presets, **FORMAT_OPTIONS}


_PAIR = re.compile(r"^([A-Za-z]{2,3}(?:[_][A-Za-z0-9]+)?)-([A-Za-z]{2,3}(?:[_][A-Za-z0-9]+)?)$")


class CorpusError(UserError, ValueError):
    """A corpus that cannot be read as asked: bad spec, missing or malformed file, unknown key."""


_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _column(raw: bytes, end: int) -> int:
    """The 1-based character column of byte ``end`` of a line (a leading BOM not counted), as
    an editor shows it."""
    return len(raw[:end].decode("utf-8", errors="replace").removeprefix("\ufeff")) + 1


def _line_fault(path, number: int, raw: bytes) -> CorpusError:
    """Why line ``number`` (its bytes ``raw``) of ``path``, not UTF-8 or holding a NUL byte, is
    no line of UTF-8 text."""
    if number == 1 and raw.startswith(_UTF16_BOMS):
        return CorpusError(
            f"{path} line 1: the file is UTF-16 (it starts with a UTF-16 byte-order mark); save the file as UTF-8"
        )
    if b"\0" in raw:
        column = _column(raw, raw.index(b"\0"))
        return CorpusError(
            f"{path} line {number}: a NUL byte at column {column} (a binary or UTF-16 file?); "
            "save the file as UTF-8 text"
        )
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return CorpusError(
            f"{path} line {number}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {_column(raw, err.start)}); "
            "save the file as UTF-8"
        )
    return CorpusError(f"{path} line {number}: not a line of UTF-8 text; save the file as UTF-8")


def text_lines(path) -> Iterator[str]:
    """The lines of a UTF-8 text file without their ends (``\\n`` or ``\\r\\n``; a BOM at the
    start of a line dropped: the file's, or one left by joining files with ``cat``), streamed:
    a file of any size, a line of any length, is read once and never held twice (a 10 MB line
    is one line, read in linear time; length filters act on it later). Only ``\\n`` ends a line:
    a lone ``\\r`` inside a line stays in it (the corpus cleaning folds it into a space).

    Raises:
        CorpusError: a line that is not UTF-8 or holds a NUL byte (a binary or UTF-16 file), as one
            line naming the file, the line and the (character) column, and what would be valid.
    """
    with open(path, "rb") as handle:
        yield from decoded_lines(handle, path)


def decoded_lines(raw_lines, name) -> Iterator[str]:
    """:func:`text_lines` for lines of bytes already open (standard input's ``sys.stdin.buffer``);
    ``name`` stands for the file in the messages ("standard input")."""
    for number, raw in enumerate(raw_lines, 1):
        if isinstance(raw, str):  # a text stream (a test's io.StringIO): decoded already
            raw = raw.encode("utf-8", "surrogateescape")
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise _line_fault(name, number, raw) from None
        if "\0" in line:
            raise _line_fault(name, number, raw)
        yield line.removeprefix("\ufeff").rstrip("\r\n")


def check_text_file(path, block: int = 1 << 20) -> int:
    """Check that ``path`` is UTF-8 text without NUL bytes, in blocks (C speed, for files that
    another library then parses); returns the file's size in bytes.

    Raises:
        CorpusError: as :func:`text_lines` does (file, line, column and what would be valid).
    """
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(block):
            if size == 0 and chunk.startswith(_UTF16_BOMS):
                break
            size += len(chunk)
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError:
                break
            if b"\0" in chunk:
                break
        else:
            try:
                decoder.decode(b"", final=True)  # a multi-byte character cut at the end
                return size
            except UnicodeDecodeError:
                pass
    for _ in text_lines(path):  # names the line and column of the fault
        pass
    raise CorpusError(f"{path}: not UTF-8 text; save the file as UTF-8")


# --------------------------------------------------------------------------------------------
# The spec
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusSpec:
    """Which corpus to load. ``str(spec)`` gives back the canonical spec string.

    Attributes:
        kind: one of ``bible``, ``multi30k``, ``text``, ``tsv``, ``jsonl``, ``hf``.
        location: folder, file, file prefix or 🤗 dataset id; ``None`` for ``bible``.
        source_lang / target_lang: language codes (``de``, ``en``, ``zh``, ``es``) or ``None``.
        options: per-kind options (see the module docstring), values as strings.
    """

    kind: str
    location: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    options: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        options = kind_options()
        if self.kind not in options:
            raise CorpusError(f"unknown corpus kind {self.kind!r}; valid kinds: {', '.join(options)}")
        if self.kind != "bible" and not self.location:
            raise CorpusError(f"corpus kind {self.kind!r} needs a location, e.g. {self.kind}:<path>")
        if self.kind == "bible" and self.location:
            raise CorpusError(f"the bible corpus takes no location; got {self.location!r}")
        unknown = sorted(set(self.options) - set(options[self.kind]))
        if unknown:
            raise CorpusError(
                f"unknown option(s) {', '.join(unknown)} for corpus kind {self.kind!r}; "
                f"valid options: {', '.join(options[self.kind])}"
            )
        if (self.source_lang is None) != (self.target_lang is None):
            raise CorpusError("give both source_lang and target_lang, or neither")
        object.__setattr__(self, "options", {k: str(v) for k, v in self.options.items()})

    @classmethod
    def parse(cls, text: str) -> CorpusSpec:
        """Parse a spec string (grammar in the module docstring).

        Raises:
            CorpusError: unknown kind or option, missing location, malformed field.
        """
        fields = [f.strip() for f in text.strip().split(":")]
        kind = fields.pop(0).lower()
        if kind not in kind_options():
            raise CorpusError(
                f"unknown corpus kind {kind!r} in spec {text!r}; valid kinds: {', '.join(kind_options())}"
            )
        options: dict[str, str] = {}
        if fields and "=" in fields[-1]:
            options = _parse_options(fields.pop(), text)
        location = None
        if kind != "bible":
            if not fields or not fields[0]:
                raise CorpusError(f"corpus spec {text!r} needs a location, e.g. {kind}:<path>")
            location = fields.pop(0)
        if kind == "hf" and fields:
            config = fields.pop(0)
            if config:
                options.setdefault("config", config)
                if not fields and _PAIR.match(config):
                    fields = [config]  # wmt16-style config named after its language pair
        src = tgt = None
        if fields:
            pair = fields.pop(0)
            match = _PAIR.match(pair)
            if not match:
                raise CorpusError(f"expected a language pair like de-en in spec {text!r}; got {pair!r}")
            src, tgt = match.groups()
        if fields:
            raise CorpusError(f"too many ':' fields in corpus spec {text!r}: {fields}")
        return cls(kind, location, src, tgt, options)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CorpusSpec:
        """Build from a dict (YAML): ``kind``, ``location`` (or ``path``), ``source_lang``,
        ``target_lang``; every other key is an option, or a dict under ``options``."""
        data = dict(data)
        try:
            kind = str(data.pop("kind")).lower()
        except KeyError:
            raise CorpusError(
                f"a corpus dict needs a 'kind' ({', '.join(kind_options())}); got keys {sorted(data)}"
            ) from None
        location = data.pop("location", None) or data.pop("path", None)
        options = dict(data.pop("options", None) or {})
        source_lang, target_lang = data.pop("source_lang", None), data.pop("target_lang", None)
        options.update(data)
        if isinstance(options.get("header"), bool):
            options["header"] = str(options["header"]).lower()
        return cls(kind, None if location is None else str(location), source_lang, target_lang, options)

    @classmethod
    def coerce(cls, spec: str | Mapping[str, Any] | CorpusSpec) -> CorpusSpec:
        """Accept a spec string, dict or :class:`CorpusSpec`."""
        if isinstance(spec, CorpusSpec):
            return spec
        if isinstance(spec, str):
            return cls.parse(spec)
        if isinstance(spec, Mapping):
            return cls.from_dict(spec)
        raise TypeError(f"a corpus spec is a str, dict or CorpusSpec; got {type(spec).__name__}")

    def __str__(self) -> str:
        fields = [self.kind]
        options = dict(self.options)
        if self.location is not None:
            fields.append(self.location)
        pair = f"{self.source_lang}-{self.target_lang}" if self.source_lang else None
        if self.kind == "hf" and "config" in options:
            config = options.pop("config")
            fields.append(config)
            if pair == config:
                pair = None
        elif self.kind == "hf" and pair:
            fields.append("")
        if pair:
            fields.append(pair)
        if options:
            fields.append(",".join(f"{k}={v}" for k, v in options.items()))
        return ":".join(fields)


def _parse_options(text: str, spec: str) -> dict[str, str]:
    options = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CorpusError(f"malformed option {item!r} in corpus spec {spec!r}; expected key=value")
        options[key.strip()] = value.strip()
    return options


# --------------------------------------------------------------------------------------------
# What was loaded
# --------------------------------------------------------------------------------------------


@dataclass
class CorpusInfo:
    """What was loaded, for logs, ``metrics.json`` (``corpus``) and the model card.

    ``counts[split]`` maps a reason to a number of pairs: ``read`` (pairs read), ``empty``
    (empty side, dropped), ``duplicate``, ``too_short``, ``too_long``, ``bad_ratio`` (dropped
    by filters), ``truncated`` (kept, cut), ``kept`` (in the returned split). ``extra`` holds
    kind-specific numbers (the Bible's verse counts).
    """

    spec: str
    name: str
    source_lang: str | None
    target_lang: str | None
    license: str | None = None
    attribution: str | None = None
    preset: str | None = None  # the kind of a named corpus of data/presets.py, else None
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Everything, as plain JSON-able types."""
        return asdict(self)

    def summary(self) -> dict[str, Any]:
        """The ``corpus`` block of ``metrics.json``: spec, name, languages, license, attribution."""
        return {k: getattr(self, k) for k in ("spec", "name", "source_lang", "target_lang", "license", "attribution")}
