"""The built-in offline corpus: verse-aligned Bible translations read from installed SWORD modules.

Debian ships public-domain Bibles as SWORD modules (``/usr/share/sword``); ``pysword`` reads
them without the C++ library. Two modules are paired verse by verse on their shared
(book, chapter, verse) references:

============  ===================  ====  =========================
module        package              lang  text
============  ===================  ====  =========================
spaRV1909eb   sword-text-sparv     es    Reina-Valera 1909
engWEB2015eb  sword-text-web       en    World English Bible
engKJV2006eb  sword-text-kjv       en    King James Version (1769)
============  ===================  ====  =========================

The default corpus (``bible``) is RV1909 -> WEB. Modules are named by module name or
abbreviation, in any case (``kjv``, ``RV1909``); other installed Bible modules work too.

Cleaning (:func:`clean_osis`). The modules are OSIS XML fragments with Strong's numbers
(``<w lemma="strong:H0430">``), translators' additions (``<transChange>``), footnotes, cross
references, section headings, poetry lines and quotation milestones. Kept: the words of every
inline element, and canonical titles (Psalm superscriptions, which RV1909 prints as part of
verse 1). Dropped with their content: notes, variant readings, catch-words, speaker labels,
non-canonical titles (section headings), and everything after the end-of-book marker (WEB
appends its glossary to Revelation 22:21). Block boundaries (line, paragraph, milestone tags,
removed notes) become a space unless punctuation follows or an opening quote precedes, so
removing a footnote never glues two words together ("God<note>..</note>created" gives
"God created"); two inline elements back to back are two words. Entities are unescaped,
KJV's pilcrows and stray USFM markers (``\\nd``) dropped, whitespace collapsed.

Pairs, counts, split. Verses are paired by reference where a chapter's verses correspond
one to one. Where they do not (RV1909 follows Spanish numbering in about 20 chapters, e.g. its
Numbers 13:1 is 12:16 elsewhere, leaving 12:16 empty; WEB leaves out Acts 8:37 and moves
Romans 16:25-27), the chapter, with the next one if its last verses are empty, is re-aligned
by verse length (Gale & Church 1993): merged verses are joined, verses without counterpart
dropped. Every empty verse slot, re-aligned chapter, merged pair and dropped verse is counted.
Validation and test are held out as whole pairing units (a chapter, or chapters re-aligned
together): numbering the units in canonical order, unit ``i`` goes to validation if
``i % 64 == 21``, to test if ``i % 64 == 53``, else to train (about 1.5% each, spread over the
whole Bible). The result is cached with ``datasets.save_to_disk`` under ``$ATTN_SEQ2SEQ_CACHE``
(default ``~/.cache/attention_seq2seq``) in ``bible/<src>-<tgt>-<key>``, the key hashing the
module versions, the cleaner version and the split rule; the first read takes 10-20 s.
"""

from __future__ import annotations

import functools
import hashlib
import html
import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets

from .presets import PRESETS
from .spec import SPLITS, CorpusError, CorpusInfo, CorpusSpec

DEFAULT_MODULE_FOR_LANGUAGE = {"es": "spaRV1909eb", "en": "engWEB2015eb"}
# `bible` without languages: the preset's pair (data/presets.py), Spanish RV1909 -> English WEB
DEFAULT_SOURCE, DEFAULT_TARGET = (DEFAULT_MODULE_FOR_LANGUAGE[lang] for lang in PRESETS["bible"].default_pair)
LANGUAGE_ALIASES = {"spa": "es", "eng": "en"}
# module name or abbreviation -> the Debian package that installs it
DEBIAN_PACKAGES = dict.fromkeys(("sparv1909eb", "rv1909"), "sword-text-sparv")
DEBIAN_PACKAGES |= dict.fromkeys(("engweb2015eb", "web"), "sword-text-web")
DEBIAN_PACKAGES |= dict.fromkeys(("engkjv2006eb", "kjv"), "sword-text-kjv")
SWORD_PATHS = ("/usr/share/sword", "~/.sword")  # unless $SWORD_PATH is set
CLEANER_VERSION = 2  # bump when cleaning or pairing changes, to invalidate caches
CHAPTER_PERIOD, VALIDATION_PHASE, TEST_PHASE = 64, 21, 53


# --------------------------------------------------------------------------------------------
# Cleaning OSIS markup
# --------------------------------------------------------------------------------------------

_TAG = re.compile(r"<(/?)([A-Za-z]+)\b([^>]*?)(/?)>")
_ATTR = re.compile(r'([A-Za-z]+)="([^"]*)"')
# Elements whose words are the verse's own words: the tags go, the text stays, no space added.
_INLINE = set(
    "w transChange divineName hi foreign seg name reference abbr q inscription mentioned salute signed closer a".split()
)
# Elements removed together with their content.
_DROPPED = {"note", "rdg", "rdgGroup", "catchWord", "index", "figure", "speaker"}
# Milestone spans (<div sID=.. type=../> .. <div eID=.. />) removed with their content.
_DROPPED_SPANS = {"introduction", "glossary"}
# USFM character markers left over from conversion (KJV: "the \\nd LORD", "LORD\\+nd*").
_USFM_MARKER = re.compile(r"\\\+?[a-z]+\d*\*?[ ]?")
_BREAK = "\x00"  # a block boundary, resolved to a space or nothing at the end
_NO_SPACE_AFTER = set("“‘«([{¿¡")
_NO_SPACE_BEFORE = set(".,;:!?)]}’”»")


def clean_osis(raw: str) -> str:
    """Plain text of one verse of OSIS markup (rules in the module docstring).

    Args:
        raw: the verse as stored in the module.

    Returns:
        The verse text with single spaces and no markup; ``""`` if nothing is left.
    """
    out: list[str] = []
    skipping: list[str] = []  # element names being dropped (nesting of the same name counted)
    skipping_span: str | None = None  # sID of a dropped milestone span
    position = previous_end = 0
    previous_inline_close = False
    for match in _TAG.finditer(raw):
        if not skipping and skipping_span is None:
            out.append(raw[position : match.start()])
        position = match.end()
        closing, name, attr_text, self_closing = match.groups()
        attrs = dict(_ATTR.findall(attr_text))
        if skipping:
            if name == skipping[-1] and not self_closing:
                if closing:
                    skipping.pop()
                else:
                    skipping.append(name)
            continue
        if skipping_span is not None:
            if attrs.get("eID") == skipping_span:
                skipping_span = None
            continue
        if name == "div" and attrs.get("type") == "book" and "eID" in attrs:
            position = len(raw)  # end of the book: what follows (glossary, appendices) is not this verse
            break
        if self_closing and attrs.get("type") in _DROPPED_SPANS and "sID" in attrs:
            skipping_span = attrs["sID"]
            continue
        dropped = name in _DROPPED or (name == "title" and attrs.get("canonical") != "true")
        if dropped and not self_closing and not closing:
            skipping.append(name)
            out.append(_BREAK)
        elif not dropped and name in _INLINE and not self_closing:
            # RV1909 writes "<w>ejército</w><transChange>se llamaba</transChange>": two inline
            # elements back to back are two words; inside or around text they add nothing.
            if not closing and previous_end == match.start() and previous_inline_close:
                out.append(_BREAK)
            previous_end, previous_inline_close = match.end(), bool(closing)
            continue
        else:
            out.append(_BREAK)
        previous_end, previous_inline_close = match.end(), False
    if not skipping and skipping_span is None:
        out.append(raw[position:])
    text = html.unescape("".join(out)).replace("¶", " ")
    text = _USFM_MARKER.sub("", text)
    text = re.sub(r"\s*" + _BREAK + r"[\s" + _BREAK + r"]*", _resolve_break, text)
    return " ".join(text.split())


def _resolve_break(match: re.Match) -> str:
    """A run of boundaries (with any whitespace around it): nothing next to punctuation that
    attaches to its neighbour ("coins<note>..</note> ?" gives "coins?"), else one space."""
    text, start, end = match.string, match.start(), match.end()
    before = text[start - 1] if start > 0 else ""
    after = text[end] if end < len(text) else ""
    if not before or not after or before in _NO_SPACE_AFTER or after in _NO_SPACE_BEFORE:
        return ""
    return " "


# --------------------------------------------------------------------------------------------
# Modules
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SwordModule:
    """One installed SWORD Bible module: its name, conf entries and library folder."""

    name: str
    conf: dict[str, str]
    library: str

    @property
    def language(self) -> str:
        return self.conf.get("lang", "").split("-")[0].lower()

    @property
    def abbreviation(self) -> str:
        return self.conf.get("abbreviation", self.name)

    @property
    def version(self) -> str:
        return f"{self.conf.get('version', '?')} ({self.conf.get('swordversiondate', '?')})"

    def open(self):
        from pysword.modules import SwordModules

        modules = SwordModules(self.library)
        modules.parse_modules()
        return modules.get_bible_from_module(self.name)


def sword_library_paths() -> list[str]:
    """Folders searched for SWORD modules, those of them holding ``mods.d``: ``$SWORD_PATH``
    (an ``os.pathsep``-separated list) if set, else ``/usr/share/sword`` and ``~/.sword``."""
    env = os.environ.get("SWORD_PATH")
    candidates = env.split(os.pathsep) if env else list(SWORD_PATHS)
    return [str(Path(p).expanduser()) for p in candidates if (Path(p).expanduser() / "mods.d").is_dir()]


def installed_modules() -> dict[str, SwordModule]:
    """Installed Bible text modules by name (the first library listing a name wins)."""
    from pysword.modules import SwordModules

    found: dict[str, SwordModule] = {}
    for library in sword_library_paths():
        parsed = SwordModules(library).parse_modules()
        for name, conf in parsed.items():
            if name not in found and "Biblical Texts" in conf.get("category", "Biblical Texts"):
                found[name] = SwordModule(name, conf, library)
    return found


def find_module(wanted: str, modules: dict[str, SwordModule] | None = None) -> SwordModule:
    """An installed module by name or abbreviation, any case.

    Raises:
        CorpusError: not installed; names the Debian package for the known modules and lists
            the installed ones.
    """
    modules = installed_modules() if modules is None else modules
    for module in modules.values():
        if wanted.lower() in (module.name.lower(), module.abbreviation.lower()):
            return module
    package = DEBIAN_PACKAGES.get(wanted.lower())
    hint = f"install it with `apt-get install {package}`" if package else "install a SWORD module that provides it"
    installed = ", ".join(f"{m.name} ({m.abbreviation})" for m in modules.values()) or "none"
    raise CorpusError(
        f"SWORD module {wanted!r} is not installed; {hint}. Searched {sword_library_paths() or list(SWORD_PATHS)}; "
        f"installed: {installed}"
    )


def resolve_modules(spec: CorpusSpec) -> tuple[SwordModule, SwordModule]:
    """The (source, target) modules a ``bible`` spec asks for."""
    modules = installed_modules()
    names = []
    for option, lang, default in (("src", spec.source_lang, DEFAULT_SOURCE), ("tgt", spec.target_lang, DEFAULT_TARGET)):
        if option in spec.options:
            names.append(spec.options[option])
            continue
        if lang is None:
            names.append(default)
            continue
        code = LANGUAGE_ALIASES.get(lang.lower(), lang.lower())
        if code not in DEFAULT_MODULE_FOR_LANGUAGE:
            raise CorpusError(
                f"no default Bible module for language {lang!r}; languages: {sorted(DEFAULT_MODULE_FOR_LANGUAGE)} "
                f"(or name modules with bible:src=<module>,tgt=<module>)"
            )
        names.append(DEFAULT_MODULE_FOR_LANGUAGE[code])
    source, target = (find_module(name, modules) for name in names)
    if source.name == target.name:
        raise CorpusError(f"source and target are the same SWORD module {source.name!r}")
    return source, target


# --------------------------------------------------------------------------------------------
# Reading, pairing, splitting, caching
# --------------------------------------------------------------------------------------------


def read_verses(module: SwordModule, books: set[str] | None = None) -> Iterator[tuple[str, int, int, str]]:
    """Every verse of a module as ``(osis_book, chapter, verse, cleaned_text)``, in canonical order.

    Args:
        module: the module to read.
        books: OSIS book names to read (e.g. ``{"Gen", "Matt"}``); all books if ``None``.
    """
    bible = module.open()
    # pysword decompresses the whole block (a book) again for every verse; keep the last blocks.
    bible._decompressed_text = functools.lru_cache(maxsize=4)(bible._decompressed_text)
    structure = bible.get_structure()
    for testament, book_list in structure.get_books().items():
        for book in book_list:
            if books is not None and book.osis_name not in books:
                continue
            offset = structure._book_offset(book.name)  # pysword has no public verse-index API
            for chapter in range(1, len(book.chapter_lengths) + 1):
                indices = book.get_indicies(chapters=[chapter], offset=offset)
                for verse, index in enumerate(indices, start=1):
                    raw = bible._text_for_index(testament, index) or ""
                    yield book.osis_name, chapter, verse, clean_osis(raw)


def split_of_unit(unit_number: int) -> str:
    """The split of the ``unit_number``-th pairing unit (0-based, canonical order; a unit is a
    chapter, or two or more chapters re-aligned together)."""
    phase = unit_number % CHAPTER_PERIOD
    return "validation" if phase == VALIDATION_PHASE else "test" if phase == TEST_PHASE else "train"


# Gale & Church (1993) alignment moves (source verses, target verses) and their costs,
# -log of prior probabilities close to the paper's (1-1 common, merges and gaps rare).
_MOVES = {(1, 1): 0.1, (2, 1): 3.0, (1, 2): 3.0, (3, 1): 4.5, (1, 3): 4.5}  # tried in this order
_MOVES |= {(4, 1): 6.0, (1, 4): 6.0, (1, 0): 5.5, (0, 1): 5.5, (2, 2): 4.5}
_ORPHAN_COST = 0.5  # a verse whose slot is empty in the other module: dropping or merging it is expected
_MISMATCH_COST = 0.5  # a pair that shares no verse reference: allowed, but equal numbering is preferred


@dataclass
class _LengthModel:
    """log(target chars / source chars) of aligned verses ~ Normal(mean, std)."""

    mean: float
    std: float

    def cost(self, source_chars: int, target_chars: int) -> float:
        z = (math.log((target_chars + 1) / (source_chars + 1)) - self.mean) / self.std
        return 0.5 * z * z


@dataclass
class _Verses:
    """The non-empty verses of one side of an alignment window."""

    refs: list[str]
    texts: list[str]
    orphan: list[bool]  # the other module has this reference, but empty


def align_verses(source: _Verses, target: _Verses, lengths: _LengthModel) -> list[tuple[list[int], list[int]]]:
    """Monotonic many-to-many alignment of two verse lists (Gale & Church 1993, by characters).

    Besides the length cost, a verse whose slot is empty on the other side (an "orphan") is
    cheap to drop or merge into a neighbour, and a pair sharing no reference pays a little,
    so equal numbering wins unless the lengths say otherwise.

    Returns:
        Groups ``(source indices, target indices)`` in order; a group with an empty side is a
        verse left without counterpart.
    """
    n, m = len(source.texts), len(target.texts)
    best = [[math.inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    best[0][0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            if best[i][j] == math.inf:
                continue
            for (a, b), prior in _MOVES.items():
                if i + a > n or j + b > m:
                    continue
                cost = best[i][j] + _group_cost(source, target, range(i, i + a), range(j, j + b), prior, lengths)
                if cost < best[i + a][j + b]:
                    best[i + a][j + b], back[i + a][j + b] = cost, (a, b)
    groups, i, j = [], n, m
    while i or j:
        a, b = back[i][j]
        groups.append((list(range(i - a, i)), list(range(j - b, j))))
        i, j = i - a, j - b
    return groups[::-1]


def _group_cost(source: _Verses, target: _Verses, s: range, t: range, prior: float, lengths: _LengthModel) -> float:
    if not s or not t:
        side, idx = (target, t) if not s else (source, s)
        return _ORPHAN_COST * len(idx) if all(side.orphan[k] for k in idx) else prior
    extras = [source.orphan[k] for k in s[1:]] + [target.orphan[k] for k in t[1:]]
    if extras and all(extras):
        prior = 0.1 + _ORPHAN_COST * len(extras)
    if not {source.refs[k] for k in s} & {target.refs[k] for k in t}:
        prior += _MISMATCH_COST
    chars_s = sum(len(source.texts[k]) for k in s) + len(s) - 1
    chars_t = sum(len(target.texts[k]) for k in t) + len(t) - 1
    return prior + lengths.cost(chars_s, chars_t)


def build_bible_pairs(source: SwordModule, target: SwordModule) -> tuple[dict[str, dict[str, list]], dict[str, Any]]:
    """Read and pair two modules.

    Chapters whose verses correspond one to one (every verse non-empty in both, or empty in
    both) are paired by reference. The others are *irregular*: a module numbers them
    differently (RV1909 starts Numbers 13 with what KJV and WEB number 12:16, and leaves 12:16
    empty), or leaves out or merges verses. An irregular chapter is re-aligned by verse length
    with :func:`align_verses`, together with the next chapter when its last verses are empty
    on one side (their text opens the next chapter there); merged verses are joined with a
    space, and a verse without counterpart is dropped and counted.

    Returns:
        ``({split: {"source", "target", "ref", "target_ref"}}, counts)``; ``ref`` names the
        first source verse of a pair (``"Num.13.2"``), ``target_ref`` the first target verse.
    """
    started = time.perf_counter()
    source_chapters = _by_chapter(read_verses(source))
    target_chapters = _by_chapter(read_verses(target, {book for book, _ in source_chapters}))
    counts = {"source_verses": sum(len(v) for v in source_chapters.values())}
    counts |= dict.fromkeys(
        "missing_in_target empty_in_source empty_in_target empty_in_both irregular_chapters merged_pairs "
        "unaligned_source_verses unaligned_target_verses paired_source_verses".split(),
        0,
    )
    units = _pairing_units(source_chapters, target_chapters, counts)
    regular = [
        pair
        for unit in units
        if len(unit) == 1 and not _irregular(unit[0], source_chapters, target_chapters)
        for pair in _pairs_by_reference(unit[0], source_chapters, target_chapters)
    ]
    lengths = _length_model(regular)

    splits: dict[str, dict[str, list]] = {s: {"source": [], "target": [], "ref": [], "target_ref": []} for s in SPLITS}
    unit_number = 0
    for unit in units:
        if len(unit) == 1 and not _irregular(unit[0], source_chapters, target_chapters):
            pairs = _pairs_by_reference(unit[0], source_chapters, target_chapters)
            counts["paired_source_verses"] += len(pairs)
        else:
            counts["irregular_chapters"] += len(unit)
            pairs = _pairs_by_alignment(unit, source_chapters, target_chapters, lengths, counts)
        if not pairs:
            continue
        columns = splits[split_of_unit(unit_number)]
        unit_number += 1
        for pair in pairs:
            for column, value in zip(("source", "target", "ref", "target_ref"), pair):
                columns[column].append(value)
    counts["pairs"] = sum(len(c["source"]) for c in splits.values())
    counts["dropped_source_verses"] = counts["source_verses"] - counts["paired_source_verses"]
    counts["units"] = unit_number
    counts["read_seconds"] = round(time.perf_counter() - started, 1)
    return splits, counts


Chapters = dict[tuple[str, int], list[tuple[int, str]]]


def _by_chapter(verses: Iterator[tuple[str, int, int, str]]) -> Chapters:
    chapters: Chapters = {}
    for book, chapter, verse, text in verses:
        chapters.setdefault((book, chapter), []).append((verse, text))
    return chapters


def _irregular(key: tuple[str, int], source: Chapters, target: Chapters) -> bool:
    """True when a verse has text on one side only, or the target has extra verses with text."""
    tgt = dict(target.get(key, []))
    src = dict(source[key])
    if any(bool(text) != bool(tgt.get(v, "")) for v, text in src.items() if v in tgt):
        return True
    return any(text for v, text in tgt.items() if v not in src)


def _pairing_units(source: Chapters, target: Chapters, counts: dict[str, int]) -> list[list[tuple[str, int]]]:
    """Chapters in canonical order, grouped: an irregular chapter whose last verse is empty on
    one side is grouped with the next chapter of the book. Counts the empty verse slots."""
    units: list[list[tuple[str, int]]] = []
    extend = False
    for key in source:
        tgt = dict(target.get(key, []))
        for verse, text in source[key]:
            if verse not in tgt:
                counts["missing_in_target"] += 1
            elif not text or not tgt[verse]:
                if not text and not tgt[verse]:
                    counts["empty_in_both"] += 1
                else:
                    counts["empty_in_source" if not text else "empty_in_target"] += 1
        if extend and units and units[-1][-1][0] == key[0]:
            units[-1].append(key)
        else:
            units.append([key])
        last_verse, last_text = source[key][-1]
        extend = _irregular(key, source, target) and (not last_text or not tgt.get(last_verse, ""))
    return units


def _pairs_by_reference(key: tuple[str, int], source: Chapters, target: Chapters) -> list[tuple[str, str, str, str]]:
    book, chapter = key
    tgt = dict(target.get(key, []))
    return [
        (text, tgt[v], f"{book}.{chapter}.{v}", f"{book}.{chapter}.{v}")
        for v, text in source[key]
        if text and tgt.get(v)
    ]


def _length_model(pairs: list[tuple[str, str, str, str]]) -> _LengthModel:
    if len(pairs) < 100:
        return _LengthModel(0.0, 0.3)
    ratios = [math.log((len(t) + 1) / (len(s) + 1)) for s, t, _, _ in pairs]
    mean = sum(ratios) / len(ratios)
    std = math.sqrt(sum((r - mean) ** 2 for r in ratios) / len(ratios))
    return _LengthModel(mean, max(std, 0.05))


def _pairs_by_alignment(
    unit: list[tuple[str, int]], source: Chapters, target: Chapters, lengths: _LengthModel, counts: dict[str, int]
) -> list[tuple[str, str, str, str]]:
    def side(mine: Chapters, other: Chapters) -> _Verses:
        verses = _Verses([], [], [])
        for book, chapter in unit:
            slots = dict(other.get((book, chapter), []))
            for verse, text in mine.get((book, chapter), []):
                if text:
                    verses.refs.append(f"{book}.{chapter}.{verse}")
                    verses.texts.append(text)
                    verses.orphan.append(not slots.get(verse))
        return verses

    src, tgt = side(source, target), side(target, source)
    pairs = []
    for s_idx, t_idx in align_verses(src, tgt, lengths):
        if not s_idx or not t_idx:
            counts["unaligned_source_verses"] += len(s_idx)
            counts["unaligned_target_verses"] += len(t_idx)
            continue
        counts["merged_pairs"] += len(s_idx) > 1 or len(t_idx) > 1
        counts["paired_source_verses"] += len(s_idx)
        pairs.append(
            (
                " ".join(src.texts[i] for i in s_idx),
                " ".join(tgt.texts[j] for j in t_idx),
                src.refs[s_idx[0]],
                tgt.refs[t_idx[0]],
            )
        )
    return pairs


def default_cache_dir() -> Path:
    """``$ATTN_SEQ2SEQ_CACHE``, else ``~/.cache/attention_seq2seq``."""
    return Path(os.environ.get("ATTN_SEQ2SEQ_CACHE") or "~/.cache/attention_seq2seq").expanduser()


def _cache_key(source: SwordModule, target: SwordModule) -> str:
    parts = [source.name, source.version, target.name, target.version, CLEANER_VERSION]
    parts += [CHAPTER_PERIOD, VALIDATION_PHASE, TEST_PHASE]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def load_bible(
    spec: CorpusSpec | str = "bible", cache_dir: str | os.PathLike | None = None
) -> tuple[datasets.DatasetDict, dict[str, Any], tuple[SwordModule, SwordModule]]:
    """The paired Bible with ``ref`` and ``target_ref`` columns (``"Gen.1.1"``), from the cache
    or built into it.

    Returns:
        ``(DatasetDict with source/target/ref/target_ref, counts, (source_module, target_module))``.

    Raises:
        CorpusError: a module is not installed (the Debian package is named) or unknown.
    """
    spec = CorpusSpec.coerce(spec)
    source, target = resolve_modules(spec)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = root / "bible" / f"{source.name}-{target.name}-{_cache_key(source, target)}"
    if not (folder / "counts.json").exists():
        splits, counts = build_bible_pairs(source, target)
        columns = ("source", "target", "ref", "target_ref")
        features = datasets.Features({c: datasets.Value("string") for c in columns})
        corpus = datasets.DatasetDict({s: datasets.Dataset.from_dict(splits[s], features=features) for s in SPLITS})
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        corpus.save_to_disk(str(staging))
        (staging / "counts.json").write_text(json.dumps(counts, indent=1))
        try:
            staging.rename(folder)  # atomic: readers see a whole cache or none
        except OSError:  # another process finished first; its copy is identical
            shutil.rmtree(staging, ignore_errors=True)
    counts = json.loads((folder / "counts.json").read_text())
    return datasets.load_from_disk(str(folder)), counts, (source, target)


def load_bible_pairs(
    spec: CorpusSpec, cache_dir: str | os.PathLike | None = None
) -> tuple[dict[str, datasets.Dataset], CorpusInfo]:
    """``load_corpus``'s reader for ``bible`` specs: splits with ``source``/``target`` and the info."""
    corpus, counts, (source, target) = load_bible(spec, cache_dir)
    src_lang, tgt_lang = source.language, target.language
    if spec.source_lang and LANGUAGE_ALIASES.get(spec.source_lang, spec.source_lang) != src_lang:
        raise CorpusError(f"module {source.name} is in {src_lang!r}, not {spec.source_lang!r}")
    if spec.target_lang and LANGUAGE_ALIASES.get(spec.target_lang, spec.target_lang) != tgt_lang:
        raise CorpusError(f"module {target.name} is in {tgt_lang!r}, not {spec.target_lang!r}")
    public = all("public domain" in m.conf.get("distributionlicense", "").lower() for m in (source, target))
    license_ = (
        "public domain"
        if public
        else "; ".join(f"{m.name}: {m.conf.get('distributionlicense', 'unknown')}" for m in (source, target))
    )
    attribution = "; ".join(
        f"{m.conf.get('description', m.name)} (SWORD module {m.name} {m.version}, {m.conf.get('shortcopyright', '')})"
        for m in (source, target)
    )
    info = CorpusInfo(
        spec=str(spec),
        name=f"Bible {source.abbreviation}-{target.abbreviation}",
        source_lang=src_lang,
        target_lang=tgt_lang,
        license=license_,
        attribution=attribution,
        preset="bible",
        extra={"verses": counts, "source_module": source.name, "target_module": target.name},
    )
    return {split: corpus[split].remove_columns(["ref", "target_ref"]) for split in SPLITS}, info
