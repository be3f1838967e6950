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
"God created"). Entities are unescaped, KJV's pilcrows dropped, whitespace collapsed.

Pairs, counts, split. A verse empty after cleaning in either module is dropped and counted
(WEB leaves Romans 16:25-27 empty and places them at 14:24-26); so is a source reference the
target module lacks. Validation and test are whole chapters: numbering the chapters that have
pairs in canonical order, chapter ``i`` goes to validation if ``i % 64 == 21``, to test if
``i % 64 == 53``, else to train (about 1.6% each, spread over the whole Bible). The result is
cached with ``datasets.save_to_disk`` under ``$ATTN_SEQ2SEQ_CACHE`` (default
``~/.cache/attention_seq2seq``) in ``bible/<src>-<tgt>-<key>``, the key hashing the module
versions, the cleaner version and the split rule; the first read takes about a minute.
"""

from __future__ import annotations

import hashlib
import html
import json
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

from .corpora import SPLITS, CorpusError, CorpusInfo, CorpusSpec

DEFAULT_SOURCE, DEFAULT_TARGET = "spaRV1909eb", "engWEB2015eb"
DEFAULT_MODULE_FOR_LANGUAGE = {"es": "spaRV1909eb", "en": "engWEB2015eb"}
LANGUAGE_ALIASES = {"spa": "es", "eng": "en"}
DEBIAN_PACKAGES = {"spaRV1909eb": "sword-text-sparv", "engWEB2015eb": "sword-text-web", "engKJV2006eb": "sword-text-kjv"}
SWORD_PATHS = ("/usr/share/sword", "~/.sword")  # plus $SWORD_PATH, searched first
CLEANER_VERSION = 1  # bump when clean_osis changes, to invalidate caches
CHAPTER_PERIOD, VALIDATION_PHASE, TEST_PHASE = 64, 21, 53


# --------------------------------------------------------------------------------------------
# Cleaning OSIS markup
# --------------------------------------------------------------------------------------------

_TAG = re.compile(r"<(/?)([A-Za-z]+)\b([^>]*?)(/?)>")
_ATTR = re.compile(r'([A-Za-z]+)="([^"]*)"')
# Elements whose words are the verse's own words: the tags go, the text stays, no space added.
_INLINE = {"w", "transChange", "divineName", "hi", "foreign", "seg", "name", "reference", "abbr", "q",
           "inscription", "mentioned", "salute", "signed", "closer", "a"}
# Elements removed together with their content.
_DROPPED = {"note", "rdg", "rdgGroup", "catchWord", "index", "figure", "speaker"}
# Milestone spans (<div sID=.. type=../> .. <div eID=.. />) removed with their content.
_DROPPED_SPANS = {"introduction", "glossary"}
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
    position = 0
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
        elif not dropped and name in _INLINE and not (self_closing and name == "q"):
            continue
        else:
            out.append(_BREAK)
    if not skipping and skipping_span is None:
        out.append(raw[position:])
    text = html.unescape("".join(out)).replace("¶", " ")
    text = re.sub(r"\s*" + _BREAK + r"[\s" + _BREAK + r"]*", _resolve_break, text)
    return " ".join(text.split())


def _resolve_break(match: re.Match) -> str:
    """A run of boundaries: a space if whitespace was there, or if it would separate two words."""
    if any(c.isspace() for c in match.group()):
        return " "
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
    """Folders searched for SWORD modules (those holding ``mods.d``): ``$SWORD_PATH`` (a
    ``os.pathsep``-separated list), then ``/usr/share/sword`` and ``~/.sword``."""
    env = os.environ.get("SWORD_PATH")
    candidates = (env.split(os.pathsep) if env else []) + list(SWORD_PATHS)
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
    package = next((pkg for name, pkg in DEBIAN_PACKAGES.items() if name.lower() == wanted.lower()), None)
    package = package or {"rv1909": "sword-text-sparv", "web": "sword-text-web", "kjv": "sword-text-kjv"}.get(wanted.lower())
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


def split_of_chapter(chapter_number: int) -> str:
    """The split of the ``chapter_number``-th chapter (0-based, canonical order)."""
    phase = chapter_number % CHAPTER_PERIOD
    return "validation" if phase == VALIDATION_PHASE else "test" if phase == TEST_PHASE else "train"


def build_bible_pairs(source: SwordModule, target: SwordModule) -> tuple[dict[str, dict[str, list]], dict[str, Any]]:
    """Read and pair two modules; returns ``({split: {"source", "target", "ref"}}, counts)``."""
    started = time.perf_counter()
    source_verses = list(read_verses(source))
    books = {book for book, _, _, _ in source_verses}
    target_text = {(b, c, v): text for b, c, v, text in read_verses(target, books)}
    counts = {"source_verses": len(source_verses), "missing_in_target": 0, "empty_in_source": 0,
              "empty_in_target": 0, "empty_in_both": 0}
    splits: dict[str, dict[str, list]] = {s: {"source": [], "target": [], "ref": []} for s in SPLITS}
    chapter_number, last_chapter = -1, None
    for book, chapter, verse, src in source_verses:
        tgt = target_text.get((book, chapter, verse))
        if tgt is None:
            counts["missing_in_target"] += 1
            continue
        if not src or not tgt:
            key = "empty_in_both" if not src and not tgt else "empty_in_source" if not src else "empty_in_target"
            counts[key] += 1
            continue
        if (book, chapter) != last_chapter:  # chapters are numbered only if they have pairs
            chapter_number, last_chapter = chapter_number + 1, (book, chapter)
        columns = splits[split_of_chapter(chapter_number)]
        columns["source"].append(src)
        columns["target"].append(tgt)
        columns["ref"].append(f"{book}.{chapter}.{verse}")
    counts["dropped"] = sum(counts[k] for k in ("missing_in_target", "empty_in_source", "empty_in_target", "empty_in_both"))
    counts["pairs"] = sum(len(c["source"]) for c in splits.values())
    counts["chapters"] = chapter_number + 1
    counts["read_seconds"] = round(time.perf_counter() - started, 1)
    return splits, counts


def default_cache_dir() -> Path:
    """``$ATTN_SEQ2SEQ_CACHE``, else ``~/.cache/attention_seq2seq``."""
    return Path(os.environ.get("ATTN_SEQ2SEQ_CACHE") or "~/.cache/attention_seq2seq").expanduser()


def _cache_key(source: SwordModule, target: SwordModule) -> str:
    parts = [source.name, source.version, target.name, target.version, CLEANER_VERSION,
             CHAPTER_PERIOD, VALIDATION_PHASE, TEST_PHASE]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def load_bible(
    spec: CorpusSpec | str = "bible", cache_dir: str | os.PathLike | None = None
) -> tuple[datasets.DatasetDict, dict[str, Any], tuple[SwordModule, SwordModule]]:
    """The paired Bible with a ``ref`` column (``"Gen.1.1"``), read from the cache or built into it.

    Returns:
        ``(DatasetDict with source/target/ref, counts, (source_module, target_module))``.

    Raises:
        CorpusError: a module is not installed (the Debian package is named) or unknown.
    """
    spec = CorpusSpec.coerce(spec)
    source, target = resolve_modules(spec)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder = root / "bible" / f"{source.name}-{target.name}-{_cache_key(source, target)}"
    if not (folder / "counts.json").exists():
        splits, counts = build_bible_pairs(source, target)
        features = datasets.Features({c: datasets.Value("string") for c in ("source", "target", "ref")})
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


def load_bible_pairs(spec: CorpusSpec, cache_dir: str | os.PathLike | None = None) -> tuple[dict[str, datasets.Dataset], CorpusInfo]:
    """``load_corpus``'s reader for ``bible`` specs: splits with ``source``/``target`` and the info."""
    corpus, counts, (source, target) = load_bible(spec, cache_dir)
    src_lang, tgt_lang = source.language, target.language
    if spec.source_lang and LANGUAGE_ALIASES.get(spec.source_lang, spec.source_lang) != src_lang:
        raise CorpusError(f"module {source.name} is in {src_lang!r}, not {spec.source_lang!r}")
    if spec.target_lang and LANGUAGE_ALIASES.get(spec.target_lang, spec.target_lang) != tgt_lang:
        raise CorpusError(f"module {target.name} is in {tgt_lang!r}, not {spec.target_lang!r}")
    license_ = "public domain" if all(
        "public domain" in m.conf.get("distributionlicense", "").lower() for m in (source, target)
    ) else "; ".join(f"{m.name}: {m.conf.get('distributionlicense', 'unknown')}" for m in (source, target))
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
        extra={"verses": counts, "source_module": source.name, "target_module": target.name},
    )
    return {split: corpus[split].remove_columns("ref") for split in SPLITS}, info
