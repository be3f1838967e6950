"""Parallel corpora as ``datasets.DatasetDict`` objects, named by one short spec string.

:func:`load_corpus` returns splits ``train``, ``validation`` and ``test``, each with the string
columns ``source`` and ``target``. The corpus is named by a spec: a string (command line, YAML
recipes), a dict, or a :class:`CorpusSpec`.

Spec grammar
------------
Fields are separated by ``:``; a trailing field holding ``=`` is a comma-separated option list::

    spec     := kind [":" location] [":" pair] [":" options]
    pair     := src "-" tgt                        (language codes, e.g. de-en, zh-en)
    options  := key "=" value ("," key "=" value)*

======================================  =====================================================
``bible``                               built-in offline Bible corpus, Spanish RV1909 -> English WEB
``bible:es-en`` / ``bible:en-es``       by languages (es: spaRV1909eb, en: engWEB2015eb)
``bible:src=spaRV1909eb,tgt=kjv``       by SWORD module (name or abbreviation, any case)
``multi30k:<dir>[:de-en]``              Multi30k folder: ``train|val|test2016.<lang>``
``tatoeba:<dir>[:zh-en]``               Tatoeba folder: ``train|dev|test.tsv`` (zh TAB en), zh-en or en-zh
``text:<dir>:<src>-<tgt>``              line-aligned files ``<dir>/<split>.<lang>``
``text:<prefix>:<src>-<tgt>``           one pair ``<prefix>.<src>`` / ``<prefix>.<tgt>`` (train only)
``tsv:<dir or file>[:<src>-<tgt>]``     tab-separated, source/target columns 0/1
``jsonl:<dir or file>[:<src>-<tgt>]``   one JSON object per line
``hf:<id or dir>[:<config>][:<pair>]``  a 🤗 datasets id, or a folder written by ``save_to_disk``
======================================  =====================================================

Locations are paths relative to the current directory (``~`` expanded); they cannot hold ``:``.
For ``hf``, a single field after the id is the config; a config shaped like a pair (wmt16's
``de-en``) also gives the languages. Give languages without a config as ``hf:<id>::de-en``.

Options (unknown ones are an error):

- every local kind and ``hf``: ``train=``, ``validation=``, ``test=`` name each split's file
  (``text``: file prefix, ``tsv``/``jsonl``: file name, ``hf``: split name). In a folder the
  defaults are found by name: ``train``; ``validation|valid|val|dev``; ``test|test2016|tst``.
  A split that is missing is carved from train at random: ``holdout=<rows>`` (default 2% of
  train, at most 1000 rows) and ``seed=<int>`` (default 0).
- ``tsv``: ``src_col=``, ``tgt_col=`` (0-based; defaults 0 and 1), ``header=true`` skips line 1.
  Tatoeba's ``cmn.txt`` (en, zh, attribution) read zh->en: ``tsv:cmn.txt:zh-en:src_col=1,tgt_col=0``.
- ``jsonl``: ``src_key=``, ``tgt_key=``. Rows are either flat (``{"de": .., "en": ..}``; keys
  default to the pair's languages, else ``source``/``target``) or nested as
  ``{"translation": {"de": .., "en": ..}}``.
- ``hf``: ``config=``; ``src_key=``/``tgt_key=`` for a two-column dataset; otherwise the
  ``translation`` column (``field=`` to rename) is read with the pair's language keys.
- ``bible``: ``src=``, ``tgt=`` (SWORD modules, see :mod:`attention_seq2seq.data.bible`).
- every kind but ``bible``: ``name=``, ``license=``, ``attribution=`` for the model card
  (values with ``,`` or ``:``, like most attributions, need the dict form).

The dict form (YAML recipes) has the keys ``kind``, ``location`` (or ``path``), ``source_lang``,
``target_lang``, and the options as further keys::

    corpus:
      kind: tsv
      location: ../shared/data/tatoeba-cmn-eng
      source_lang: zh
      target_lang: en
      license: CC-BY 2.0 FR
      attribution: "Attribution: www.manythings.org/anki and tatoeba.org"

Every kind drops pairs that are empty on either side and counts them. Optional
:class:`CorpusFilters` (Unicode normalization on all splits; duplicate, length and
length-ratio filters on train only, so evaluation sets stay comparable) report their counts
in :class:`CorpusInfo`. Errors that the user can fix raise :class:`CorpusError`, naming the
file, line, key or module at fault and listing the valid choices.

Hostile files: every local file (and every text data file of a local ``hf`` folder) is read as
UTF-8; CRLF line ends and a BOM give the pairs of the clean file; invalid UTF-8, a NUL byte or a
UTF-16 file is one line naming the file, line and column; a 10 MB line is read (in linear time;
``max_length`` drops it); an empty file, a source without its target (line counts that differ,
a TSV row short of a column or with a stray tab, a JSONL or 🤗 row without a target string) is
one line naming the file and the line or row. Blank lines at the end of one of two line-aligned
files, and blank lines of a TSV file, hold no pair.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import json
import os
import shutil
import tempfile
import unicodedata
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import datasets

from .presets import PRESETS
from .spec import (  # noqa: F401  (public names of this module)
    SPLITS,
    CorpusError,
    CorpusInfo,
    CorpusSpec,
    check_text_file,
    text_lines,
)

_SPLIT_CANDIDATES = {
    "train": ("train",),
    "validation": ("validation", "valid", "val", "dev"),
    "test": ("test", "test2016", "tst"),
}

# --------------------------------------------------------------------------------------------
# Filters and the report
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusFilters:
    """Optional cleaning applied after reading.

    Attributes:
        normalize: ``"NFC"`` or ``"NFKC"`` Unicode normalization of every split, or ``None``.
        dedup: drop exact duplicate (source, target) pairs from train (first kept).
        min_length: drop train pairs with a side shorter than this many units.
        max_length: longest side allowed in train, in units; see ``overlong``.
        max_ratio: drop train pairs whose longer side has more than ``max_ratio`` times the
            units of the shorter side (both lengths counted as at least 1).
        length_unit: ``"words"`` (whitespace tokens) or ``"chars"`` (characters, not spaces).
            Use ``"chars"`` for languages written without spaces, such as Chinese.
        overlong: ``"filter"`` drops train pairs over ``max_length``; ``"truncate"`` cuts the
            long side to ``max_length`` units.
    """

    normalize: Literal["NFC", "NFKC"] | None = None
    dedup: bool = False
    min_length: int | None = None
    max_length: int | None = None
    max_ratio: float | None = None
    length_unit: Literal["words", "chars"] = "words"
    overlong: Literal["filter", "truncate"] = "filter"

    def __post_init__(self) -> None:
        if self.normalize is not None and self.normalize not in ("NFC", "NFKC"):
            raise CorpusError(f"normalize must be one of 'NFC', 'NFKC', None; got {self.normalize!r}")
        if self.length_unit not in ("words", "chars"):
            raise CorpusError(f"length_unit must be one of 'words', 'chars'; got {self.length_unit!r}")
        if self.overlong not in ("filter", "truncate"):
            raise CorpusError(f"overlong must be one of 'filter', 'truncate'; got {self.overlong!r}")
        for name in ("min_length", "max_length", "max_ratio"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise CorpusError(f"{name} must be positive; got {value!r}")

    @classmethod
    def coerce(cls, filters: CorpusFilters | Mapping[str, Any] | None) -> CorpusFilters:
        if filters is None:
            return cls()
        if isinstance(filters, CorpusFilters):
            return filters
        unknown = sorted(set(filters) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise CorpusError(f"unknown corpus filter(s) {unknown}; valid: {sorted(cls.__dataclass_fields__)}")
        return cls(**filters)


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def load_corpus(
    spec: str | Mapping[str, Any] | CorpusSpec,
    filters: CorpusFilters | Mapping[str, Any] | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    return_info: bool = False,
) -> datasets.DatasetDict | tuple[datasets.DatasetDict, CorpusInfo]:
    """Load a parallel corpus as splits ``train``, ``validation``, ``test`` of ``source``/``target`` strings.

    Args:
        spec: spec string, dict or :class:`CorpusSpec` (grammar in the module docstring).
        filters: optional :class:`CorpusFilters` or a dict of its fields.
        cache_dir: where the Bible corpus keeps its prepared copy (default
            ``$ATTN_SEQ2SEQ_CACHE`` or ``~/.cache/attention_seq2seq``) and ``hf`` datasets that
            ``load_dataset`` prepares (``<cache_dir>/hf``; default: the 🤗 datasets cache).
            Local files are read directly.
        return_info: also return the :class:`CorpusInfo` (names, languages, license, counts).

    Returns:
        The ``DatasetDict``, or ``(DatasetDict, CorpusInfo)`` with ``return_info``.

    Raises:
        CorpusError: bad spec, missing file or module, line-count mismatch, malformed row,
            unknown column/key/language, or an empty train split after filtering.
    """
    spec = CorpusSpec.coerce(spec)
    filters = CorpusFilters.coerce(filters)
    if spec.kind == "bible":
        from .bible import load_bible_pairs  # pysword is only needed here

        raw, info = load_bible_pairs(spec, cache_dir=cache_dir)
    else:
        file_format = PRESETS[spec.kind].format if spec.kind in PRESETS else spec.kind
        raw, info = _read_hf(spec, cache_dir) if file_format == "hf" else _READERS[file_format](spec)
        raw = _fill_missing_splits(raw, spec, info)
    # pop: a split read into a memory-mapped file is released once its cleaned copy exists
    corpus = datasets.DatasetDict({split: _clean_split(raw.pop(split), split, filters, info) for split in SPLITS})
    if len(corpus["train"]) == 0:
        raise CorpusError(f"corpus {spec} has no training pairs left after filtering: {info.counts['train']}")
    return (corpus, info) if return_info else corpus


# --------------------------------------------------------------------------------------------
# Readers: each returns ({split: Dataset(source, target)} for the splits present, CorpusInfo)
# --------------------------------------------------------------------------------------------


def _pairs_dataset(sources: list[str], targets: list[str]) -> datasets.Dataset:
    features = datasets.Features({"source": datasets.Value("string"), "target": datasets.Value("string")})
    return datasets.Dataset.from_dict({"source": sources, "target": targets}, features=features)


def _resolve(location: str) -> Path:
    return Path(location).expanduser().resolve()


def _info(spec: CorpusSpec, name: str | None = None) -> CorpusInfo:
    """The info of a corpus read by a format reader: a preset's name, licence and attribution
    (data/presets.py), each overridden by the spec's ``name=``, ``license=``, ``attribution=``."""
    preset = PRESETS.get(spec.kind)
    kwargs: dict[str, Any] = {}
    if preset is not None:
        name = preset.name.format(src=spec.source_lang, tgt=spec.target_lang) if preset.name else None
        kwargs = {"license": preset.license, "attribution": preset.attribution, "preset": preset.kind}
    kwargs.update({k: spec.options[k] for k in ("license", "attribution") if k in spec.options})
    name = spec.options.get("name", name or str(spec))
    return CorpusInfo(str(spec), name, spec.source_lang, spec.target_lang, **kwargs)


def _split_files(spec: CorpusSpec, folder: Path, exists) -> dict[str, str]:
    """Map each split present to its file stem: the ``train=``... option, else the first
    default name for which ``exists(stem)`` is true."""
    found = {}
    for split in SPLITS:
        if split in spec.options:
            if not exists(spec.options[split]):
                raise CorpusError(f"{split} file {spec.options[split]!r} (option {split}=) not found in {folder}")
            found[split] = spec.options[split]
            continue
        for stem in _SPLIT_CANDIDATES[split]:
            if exists(stem):
                found[split] = stem
                break
    if "train" not in found:
        raise CorpusError(
            f"no train split in {folder}: expected a file named after 'train' (or option train=); "
            f"files there: {sorted(p.name for p in folder.iterdir())[:20]}"
        )
    return found


def _aligned_lines(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """``(source line, target line)`` of two line-aligned files, streamed. Blank lines at the
    end of the longer file (an editor's extra newline) pair with nothing and are dropped.

    Raises:
        CorpusError: the files differ in length (both line counts named, and the first line
            without a partner), once the shorter ends.
    """
    count = 0
    src_lines, tgt_lines = text_lines(src_path), text_lines(tgt_path)
    for source, target in itertools.zip_longest(src_lines, tgt_lines):
        if source is None or target is None:
            longer_path, longer, unpaired = (
                (tgt_path, tgt_lines, target) if source is None else (src_path, src_lines, source)
            )
            rest, first = 0, None  # the longer file's lines without a partner; the first not blank
            for line in itertools.chain([unpaired], longer):
                rest += 1
                if first is None and line.strip():
                    first = count + rest
            if first is None:
                return  # only blank lines beyond the shorter file: the same pairs
            n_src, n_tgt = count + (0 if source is None else rest), count + (0 if target is None else rest)
            raise CorpusError(
                f"line-aligned files differ in length: {src_path} has {n_src} lines, {tgt_path} has {n_tgt} lines "
                f"({longer_path} line {first} has no partner); each line of one file must be the translation "
                "of the same line of the other"
            )
        count += 1
        yield source, target


# A split with more pairs than this is written to a temporary Arrow file and memory-mapped
# (datasets' own format), and cleaned into files beside it rather than in memory; smaller ones
# stay in memory as before.
SPILL_PAIRS = 200_000


@functools.cache
def _spill_dir() -> Path:
    """This process's folder of temporary Arrow files (removed at exit)."""
    folder = Path(tempfile.mkdtemp(prefix="attention_seq2seq_corpus_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _spill_file(stem: str) -> str:
    return str(_spill_dir() / f"{stem}-{uuid.uuid4().hex[:12]}.arrow")


def _pairs_from_rows(rows: Iterable[tuple[str, str]]) -> datasets.Dataset:
    """A ``source``/``target`` dataset from streamed pairs: in memory up to :data:`SPILL_PAIRS`
    pairs, else written chunk by chunk to a memory-mapped Arrow file."""
    import pyarrow as pa

    rows = iter(rows)
    chunks = iter(lambda: list(itertools.islice(rows, SPILL_PAIRS)), [])  # lists of up to SPILL_PAIRS pairs
    first = next(chunks, [])
    if len(first) < SPILL_PAIRS:
        return _pairs_dataset([s for s, _ in first], [t for _, t in first])
    path = _spill_file("pairs")
    schema = pa.schema([("source", pa.string()), ("target", pa.string())])
    with pa.ipc.new_stream(path, schema) as writer:
        for chunk in itertools.chain([first], chunks):
            sources, targets = zip(*chunk)
            writer.write_batch(
                pa.record_batch([pa.array(sources, pa.string()), pa.array(targets, pa.string())], schema=schema)
            )
    return datasets.Dataset.from_file(path)


def _map_options(dataset: datasets.Dataset, stem: str) -> dict[str, Any]:
    """``map``'s storage: in memory for a small split, a temporary file (never one next to a
    user's dataset) for a large one."""
    if len(dataset) <= SPILL_PAIRS:
        return {"keep_in_memory": True}
    return {"keep_in_memory": False, "cache_file_name": _spill_file(stem)}


def _read_text(spec: CorpusSpec) -> tuple[dict[str, datasets.Dataset], CorpusInfo]:
    preset = PRESETS.get(spec.kind)
    if preset is not None and preset.default_pair and spec.source_lang is None:
        spec = replace(spec, source_lang=preset.default_pair[0], target_lang=preset.default_pair[1])
    if spec.source_lang is None:
        raise CorpusError(f"corpus {spec} needs a language pair for the file suffixes, e.g. text:<dir>:de-en")
    src, tgt = spec.source_lang, spec.target_lang
    root = _resolve(spec.location)
    if root.is_dir():
        splits = _split_files(spec, root, lambda stem: any(root.glob(f"{stem}.*")))
        prefixes = {split: root / stem for split, stem in splits.items()}
    elif Path(f"{root}.{src}").exists():
        prefixes = {"train": root}
    else:
        raise CorpusError(
            f"{spec.kind} corpus location {spec.location!r} is neither a folder nor a prefix of {root}.{src}"
        )
    out = {}
    for split, prefix in prefixes.items():
        src_path, tgt_path = Path(f"{prefix}.{src}"), Path(f"{prefix}.{tgt}")
        for path, lang in ((src_path, src), (tgt_path, tgt)):
            if not path.exists():
                langs = sorted(p.suffix.lstrip(".") for p in path.parent.glob(f"{prefix.name}.*"))
                raise CorpusError(f"no {lang!r} file {path}; languages found for {prefix.name}: {langs}")
        out[split] = _pairs_from_rows(_aligned_lines(src_path, tgt_path))
        if len(out[split]) == 0:
            raise CorpusError(
                f"no {split} pairs: {src_path} and {tgt_path} are empty; give one sentence per line in each, "
                "line N of one the translation of line N of the other"
            )
    return out, _info(spec)


def _int_option(spec: CorpusSpec, key: str, default: int) -> int:
    value = spec.options.get(key)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise CorpusError(f"option {key}= of corpus {spec} must be an integer; got {value!r}") from None


def _local_files(spec: CorpusSpec, suffix: str) -> dict[str, Path]:
    root = _resolve(spec.location)
    if root.is_dir():
        splits = _split_files(spec, root, lambda stem: (root / stem).exists() or (root / f"{stem}{suffix}").exists())
        return {s: root / stem if (root / stem).is_file() else root / f"{stem}{suffix}" for s, stem in splits.items()}
    if root.is_file():
        return {"train": root}
    raise CorpusError(f"{spec.kind} corpus location not found: {root}")


def _read_tsv(spec: CorpusSpec) -> tuple[dict[str, datasets.Dataset], CorpusInfo]:
    default_cols = (0, 1)
    preset = PRESETS.get(spec.kind)
    if preset is not None and preset.columns:  # a preset's files hold known languages in known columns
        if spec.source_lang is None:
            spec = replace(spec, source_lang=preset.default_pair[0], target_lang=preset.default_pair[1])
        pair = (spec.source_lang, spec.target_lang)
        if not set(pair) <= set(preset.columns) or pair[0] == pair[1]:
            valid = " or ".join(f"{a}-{b}" for a in preset.columns for b in preset.columns if a != b)
            raise CorpusError(f"the {spec.kind} corpus is {valid}; got {pair[0]}-{pair[1]}")
        default_cols = (preset.columns[pair[0]], preset.columns[pair[1]])
    src_col, tgt_col = _int_option(spec, "src_col", default_cols[0]), _int_option(spec, "tgt_col", default_cols[1])
    skip_header = spec.options.get("header", "false").lower() in ("1", "true", "yes")
    needed = max(src_col, tgt_col) + 1

    def rows(path: Path, lines: list[int]) -> Iterator[tuple[str, str]]:
        first = None  # (line number, columns) of the first row: every row has as many
        for number, line in enumerate(text_lines(path), start=1):
            lines[0] = number
            if (number == 1 and skip_header) or not line.strip():
                continue  # the header; a blank line holds no pair
            row = line.split("\t")
            if len(row) < needed:
                raise CorpusError(
                    f"{path}, line {number}: expected at least {needed} tab-separated columns "
                    f"(src_col={src_col}, tgt_col={tgt_col}), found {len(row)}: {line[:80]!r}"
                )
            if first is None:
                first = (number, len(row))
            elif len(row) != first[1]:
                raise CorpusError(
                    f"{path}, line {number}: {len(row)} tab-separated columns, but line {first[0]} has {first[1]} "
                    f"(a tab inside a sentence?): {line[:80]!r}; give every line the same columns"
                )
            yield row[src_col], row[tgt_col]

    return _read_local_files(spec, ".tsv", rows, "one pair per line, source and target tab-separated")


def _read_local_files(spec: CorpusSpec, suffix: str, rows, valid: str) -> tuple[dict, CorpusInfo]:
    """Each split's file read by ``rows(path, lines)`` (which keeps ``lines[0]`` at the last line
    number read); a file that holds no pair (empty, or nothing but blank lines and a header) is
    one line naming it and what would be ``valid``."""
    out = {}
    for split, path in _local_files(spec, suffix).items():
        lines = [0]
        out[split] = _pairs_from_rows(rows(path, lines))
        if len(out[split]) == 0:
            what = "the file is empty" if lines[0] == 0 else f"its {lines[0]} line(s) hold no pair (blank, or a header)"
            raise CorpusError(f"{path}: no pairs in it ({what}); give {valid}")
    return out, _info(spec)


def _read_jsonl(spec: CorpusSpec) -> tuple[dict[str, datasets.Dataset], CorpusInfo]:
    default_keys = (spec.source_lang, spec.target_lang) if spec.source_lang else ("source", "target")
    src_key = spec.options.get("src_key", default_keys[0])
    tgt_key = spec.options.get("tgt_key", default_keys[1])

    def rows(path: Path, lines: list[int]) -> Iterator[tuple[str, str]]:
        for number, line in enumerate(text_lines(path), start=1):
            lines[0] = number
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"{path}, line {number}: not valid JSON ({err.msg}): {line[:80]!r}") from None
            if isinstance(row, dict) and isinstance(row.get("translation"), dict):
                row = row["translation"]
            if not isinstance(row, dict):
                raise CorpusError(f"{path}, line {number}: expected a JSON object, got {type(row).__name__}")
            for key in (src_key, tgt_key):
                if not isinstance(row.get(key), str):
                    problem = "is missing" if key not in row else "is not a string"
                    raise CorpusError(
                        f"{path}, line {number}: key {key!r} {problem}; keys on this line: {sorted(row)} "
                        f"(choose with src_key=/tgt_key= or the language pair)"
                    )
            yield row[src_key], row[tgt_key]

    example = json.dumps({src_key: "...", tgt_key: "..."})
    return _read_local_files(spec, ".jsonl", rows, f"one JSON object per line, e.g. {example}")


def _read_hf(
    spec: CorpusSpec, cache_dir: str | os.PathLike | None = None
) -> tuple[dict[str, datasets.Dataset], CorpusInfo]:
    local = Path(spec.location).expanduser()
    config = spec.options.get("config")
    if (local / "dataset_dict.json").exists() or (local / "state.json").exists():
        loaded = datasets.load_from_disk(str(local))  # written by save_to_disk
    else:
        hf_cache = None if cache_dir is None else str(Path(cache_dir).expanduser() / "hf")
        if local.is_dir():
            _check_data_files(local)
        try:
            loaded = datasets.load_dataset(str(local) if local.exists() else spec.location, config, cache_dir=hf_cache)
        except (FileNotFoundError, ValueError) as err:  # ValueError: e.g. a missing or unknown config
            raise CorpusError(f"cannot load dataset {spec.location!r} (config {config!r}): {err}") from None
        except Exception as err:  # a data file the builder cannot parse: its own error says where
            if not local.is_dir() and not isinstance(err, datasets.exceptions.DatasetGenerationError):
                raise
            hint = "; fix the data file, or convert it to JSON Lines (one object per line)" if local.is_dir() else ""
            raise CorpusError(
                f"cannot load dataset {spec.location!r} (config {config!r}): {_root_cause(err)}{hint}"
            ) from None
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})

    names = {}
    for split in SPLITS:
        wanted = spec.options.get(split)
        if wanted is not None:
            if wanted not in loaded:
                raise CorpusError(f"dataset {spec.location!r} has no split {wanted!r}; splits: {sorted(loaded)}")
            names[split] = wanted
        else:
            present = [name for name in _SPLIT_CANDIDATES[split] if name in loaded]
            if present:
                names[split] = present[0]
    if "train" not in names:
        raise CorpusError(f"dataset {spec.location!r} has no train split (option train=); splits: {sorted(loaded)}")

    out = {}
    for split, name in names.items():
        out[split] = _hf_columns(loaded[name], spec, name)
    return out, _info(spec, f"{spec.location}" + (f" ({config})" if config else ""))


# The data files of a local folder that 🤗 datasets' packaged builders read as text.
_TEXT_DATA_SUFFIXES = (".csv", ".tsv", ".json", ".jsonl", ".ndjson", ".txt")


def _check_data_files(folder: Path) -> None:
    """Refuse a text data file of a local ``hf:`` folder that is not UTF-8, holds a NUL byte or
    is empty, naming it (and the line and column), before 🤗 datasets reads it: its readers
    fail on these with a deep traceback or, for invalid UTF-8 in JSON, keep the bytes and
    fail later. (A CRLF or a BOM they read correctly.) One pass over each file in blocks.

    Raises:
        CorpusError: naming the file, the line and column, and what would be valid.
    """
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.suffix.lower() not in _TEXT_DATA_SUFFIXES or any(p.startswith(".") for p in parts):
            continue
        if path.is_file() and check_text_file(path) == 0:
            raise CorpusError(f"{path}: no rows in it (the file is empty); give one row per pair, or remove the file")


def _root_cause(err: BaseException) -> str:
    """``Type: first line`` of the innermost exception under ``err`` (🤗 datasets wraps the
    reader's own error in a ``DatasetGenerationError`` that says nothing)."""
    seen = {id(err)}
    while (inner := err.__cause__ or err.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        err = inner
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _hf_strings(values, location: str, split_name: str, column: str) -> list[str]:
    """``values`` as a list of strings, or one line naming the first row that is not one."""
    values = list(values)
    for row, value in enumerate(values):
        if not isinstance(value, str):
            what = "missing (null)" if value is None else f"of type {type(value).__name__}, not a string"
            raise CorpusError(
                f"dataset {location!r} split {split_name!r} row {row} (counting from 0): {column} is {what}; "
                "every row needs a source and a target string"
            )
    return values


def _hf_columns(dataset: datasets.Dataset, spec: CorpusSpec, split_name: str) -> datasets.Dataset:
    """Pick the source and target strings out of a 🤗 split, in either layout."""
    columns = dataset.column_names
    nested = spec.options.get("field", "translation")
    if "src_key" in spec.options or "tgt_key" in spec.options:
        keys = spec.options.get("src_key", "source"), spec.options.get("tgt_key", "target")
        for key in keys:
            if key not in columns:
                raise CorpusError(
                    f"dataset {spec.location!r} split {split_name!r} has no column {key!r}; columns: {columns}"
                )
    elif nested in columns:
        if spec.source_lang is None:
            raise CorpusError(
                f"dataset {spec.location!r} has a {nested!r} column: give the language pair, e.g. hf:<id>::de-en"
            )
        rows = dataset[nested]
        available = sorted(rows[0]) if len(rows) else []
        for lang in (spec.source_lang, spec.target_lang):
            if len(rows) and lang not in rows[0]:
                raise CorpusError(
                    f"dataset {spec.location!r} split {split_name!r}: no language {lang!r} in column "
                    f"{nested!r}; languages: {available}"
                )
        return _pairs_dataset(
            *(
                _hf_strings(
                    (r.get(lang) if isinstance(r, dict) else None for r in rows),
                    spec.location,
                    split_name,
                    f"{nested}[{lang!r}]",
                )
                for lang in (spec.source_lang, spec.target_lang)
            )
        )
    elif spec.source_lang and spec.source_lang in columns and spec.target_lang in columns:
        keys = spec.source_lang, spec.target_lang
    elif "source" in columns and "target" in columns:
        keys = "source", "target"
    else:
        raise CorpusError(
            f"dataset {spec.location!r} split {split_name!r}: cannot find the text; columns: {columns}. "
            f"Use a {nested!r} column with a language pair, or src_key=/tgt_key="
        )
    return _pairs_dataset(*(_hf_strings(dataset[k], spec.location, split_name, repr(k)) for k in keys))


# One reader per generic format (data/spec.py's FORMAT_OPTIONS); a preset is read by its format's.
_READERS = {"text": _read_text, "tsv": _read_tsv, "jsonl": _read_jsonl}


def _fill_missing_splits(
    raw: dict[str, datasets.Dataset], spec: CorpusSpec, info: CorpusInfo
) -> dict[str, datasets.Dataset]:
    """Carve validation/test that the corpus lacks out of train, at random with a seed."""
    missing = [split for split in SPLITS if split not in raw]
    if not missing:
        return raw
    train = raw["train"]
    default = max(1, min(1000, round(0.02 * len(train))))
    size = _int_option(spec, "holdout", default)
    seed = _int_option(spec, "seed", 0)
    if size * len(missing) >= len(train):
        raise CorpusError(
            f"corpus {spec} has {len(train)} training pairs, too few to hold out {size} pairs for each of {missing}"
        )
    shuffled = train.shuffle(seed=seed)
    out = dict(raw)
    for i, split in enumerate(missing):
        out[split] = shuffled.select(range(i * size, (i + 1) * size))
    out["train"] = shuffled.select(range(len(missing) * size, len(shuffled)))
    info.extra["held_out_from_train"] = {split: size for split in missing}
    return out


# --------------------------------------------------------------------------------------------
# Cleaning and filters
# --------------------------------------------------------------------------------------------


def _length(text: str, unit: str) -> int:
    return len(text.split()) if unit == "words" else sum(not c.isspace() for c in text)


def _truncate(text: str, limit: int, unit: str) -> str:
    if unit == "words":
        return " ".join(text.split()[:limit])
    kept, count = [], 0
    for char in text:
        if not char.isspace():
            if count == limit:
                break
            count += 1
        kept.append(char)
    return "".join(kept).rstrip()


def _clean_split(dataset: datasets.Dataset, split: str, filters: CorpusFilters, info: CorpusInfo) -> datasets.Dataset:
    """Strip, normalize, drop empty pairs (all splits) and apply the train-only filters, counting each."""
    counts = info.counts.setdefault(split, {})
    counts.setdefault("read", len(dataset))
    form = filters.normalize

    def strip(batch: dict[str, list[str]]) -> dict[str, list[str]]:
        out = {}
        for column in ("source", "target"):
            texts = [" ".join(t.split()) for t in batch[column]]  # also folds tabs and runs of spaces
            out[column] = [unicodedata.normalize(form, t) for t in texts] if form else texts
        return out

    dataset = dataset.map(strip, batched=True, desc=f"clean {split}", **_map_options(dataset, f"clean-{split}"))
    dataset = _count_filter(dataset, counts, "empty", lambda s, t: bool(s) and bool(t))
    if split == "train":
        if filters.dedup:
            seen: set[tuple[str, str]] = set()

            def first_seen(s: str, t: str) -> bool:
                if (s, t) in seen:
                    return False
                seen.add((s, t))
                return True

            dataset = _count_filter(dataset, counts, "duplicate", first_seen)
        unit = filters.length_unit
        if filters.min_length:
            low = filters.min_length
            dataset = _count_filter(
                dataset, counts, "too_short", lambda s, t: min(_length(s, unit), _length(t, unit)) >= low
            )
        if filters.max_length and filters.overlong == "filter":
            high = filters.max_length
            dataset = _count_filter(
                dataset, counts, "too_long", lambda s, t: max(_length(s, unit), _length(t, unit)) <= high
            )
        elif filters.max_length:
            dataset = _truncate_split(dataset, counts, filters.max_length, unit)
        if filters.max_ratio:
            ratio = filters.max_ratio

            def ratio_ok(s: str, t: str) -> bool:
                a, b = max(_length(s, unit), 1), max(_length(t, unit), 1)
                return max(a, b) / min(a, b) <= ratio

            dataset = _count_filter(dataset, counts, "bad_ratio", ratio_ok)
    counts["kept"] = len(dataset)
    return dataset


def _count_filter(dataset: datasets.Dataset, counts: dict[str, int], reason: str, keep) -> datasets.Dataset:
    before = len(dataset)
    dataset = dataset.filter(
        lambda batch: [keep(s, t) for s, t in zip(batch["source"], batch["target"])],
        batched=True,
        keep_in_memory=True,  # never write cache files next to a user's (maybe read-only) dataset
        desc=f"filter {reason}",
    )
    counts[reason] = counts.get(reason, 0) + before - len(dataset)
    return dataset


def _truncate_split(dataset: datasets.Dataset, counts: dict[str, int], limit: int, unit: str) -> datasets.Dataset:
    over = sum(max(_length(s, unit), _length(t, unit)) > limit for s, t in zip(dataset["source"], dataset["target"]))
    counts["truncated"] = counts.get("truncated", 0) + over

    def cut(batch: dict[str, list[str]]) -> dict[str, list[str]]:
        return {c: [_truncate(t, limit, unit) for t in batch[c]] for c in ("source", "target")}

    return dataset.map(cut, batched=True, desc="truncate", **_map_options(dataset, "truncate"))
