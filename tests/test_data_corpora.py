"""Tests for attention_seq2seq.data.corpora and .bible: specs, readers, filters, errors, the Bible.

Local corpora are slices of ../shared/data written to tmp_path; the Bible is read once per
session into a temporary cache (the cold read time is printed). No test touches the network.
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from pathlib import Path

import datasets
import pytest

from attention_seq2seq.data import CorpusError, CorpusFilters, CorpusSpec, load_corpus
from attention_seq2seq.data.bible import (
    CHAPTER_PERIOD,
    clean_osis,
    find_module,
    installed_modules,
    load_bible,
    read_verses,
    split_of_unit,
)

from helpers import FIXTURE_TATOEBA, tatoeba_dir

BIBLE_MODULES = ("spaRV1909eb", "engWEB2015eb")

# Every test here runs offline and without progress bars (fixtures in conftest.py).
pytestmark = pytest.mark.usefixtures("no_network", "quiet_datasets")


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def head(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.fixture
def multi30k_slice(tmp_path) -> Path:
    """train 300 / val 40 / test2016 30 real sentence pairs (helpers.read_pairs: Multi30k, else the
    committed Bible pairs) in Multi30k's own file names, source side as .de, target side as .en."""
    from helpers import read_pairs

    for split, stem, n in (("train", "train", 300), ("val", "val", 40), ("test", "test2016", 30)):
        pairs = read_pairs(n, split=split)
        write_lines(tmp_path / f"{stem}.de", [source for source, _ in pairs])
        write_lines(tmp_path / f"{stem}.en", [target for _, target in pairs])
    return tmp_path


# --------------------------------------------------------------------------------------------
# Spec grammar
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, kind, location, pair, options",
    [
        ("bible", "bible", None, (None, None), {}),
        ("bible:es-en", "bible", None, ("es", "en"), {}),
        (
            "bible:src=spaRV1909eb,tgt=engKJV2006eb",
            "bible",
            None,
            (None, None),
            {"src": "spaRV1909eb", "tgt": "engKJV2006eb"},
        ),
        ("multi30k:../shared/data/multi30k:de-en", "multi30k", "../shared/data/multi30k", ("de", "en"), {}),
        (
            "tsv:data/cmn.txt:zh-en:src_col=1,tgt_col=0",
            "tsv",
            "data/cmn.txt",
            ("zh", "en"),
            {"src_col": "1", "tgt_col": "0"},
        ),
        ("jsonl:data:de-en:src_key=de,tgt_key=en", "jsonl", "data", ("de", "en"), {"src_key": "de", "tgt_key": "en"}),
        ("hf:wmt16:de-en", "hf", "wmt16", ("de", "en"), {"config": "de-en"}),
        ("hf:org/two_col::zh-en:src_key=zh", "hf", "org/two_col", ("zh", "en"), {"src_key": "zh"}),
        ("hf:org/ds:cfg:de-en", "hf", "org/ds", ("de", "en"), {"config": "cfg"}),
    ],
)
def test_spec_parse_and_round_trip(text, kind, location, pair, options):
    spec = CorpusSpec.parse(text)
    assert (spec.kind, spec.location, (spec.source_lang, spec.target_lang), dict(spec.options)) == (
        kind,
        location,
        pair,
        options,
    )
    assert CorpusSpec.parse(str(spec)) == spec


def test_spec_dict_form_equals_string_form():
    from_dict = CorpusSpec.coerce(
        {"kind": "tsv", "path": "data/cmn.txt", "source_lang": "zh", "target_lang": "en", "src_col": 1, "tgt_col": 0}
    )
    assert from_dict == CorpusSpec.parse("tsv:data/cmn.txt:zh-en:src_col=1,tgt_col=0")


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "wikipedia:foo",
            r"unknown corpus kind 'wikipedia'.*valid kinds: bible, multi30k, tatoeba, text, tsv, jsonl, hf",
        ),
        ("tsv:data:zh-en:column=2", r"unknown option\(s\) column .*valid options: .*src_col, tgt_col"),
        ("tsv", r"needs a location"),
        ("text:data:german", r"expected a language pair"),
        ("bible:es-en:src", r"too many|language pair"),
    ],
)
def test_spec_errors_name_the_problem(text, expected):
    with pytest.raises(CorpusError, match=expected):
        CorpusSpec.parse(text)


# --------------------------------------------------------------------------------------------
# Local readers: pair counts on the shared corpora
# --------------------------------------------------------------------------------------------


def test_multi30k_full_counts(shared_data):
    corpus, info = load_corpus(f"multi30k:{shared_data / 'multi30k'}", return_info=True)
    # The numbers of lines documented in shared/data/README.md.
    assert {s: len(d) for s, d in corpus.items()} == {"train": 29000, "validation": 1014, "test": 1000}
    assert corpus["train"].column_names == ["source", "target"]
    first = [head(shared_data / "multi30k" / f"train.{lang}", 1)[0] for lang in ("de", "en")]
    assert corpus["train"][0] == {"source": first[0], "target": first[1]}
    assert (info.source_lang, info.target_lang) == ("de", "en")
    assert "Elliott" in info.attribution


def test_text_slice_counts_and_direction(multi30k_slice):
    corpus = load_corpus(f"text:{multi30k_slice}:en-de")
    assert {s: len(d) for s, d in corpus.items()} == {"train": 300, "validation": 40, "test": 30}
    assert corpus["test"][29]["source"] == head(multi30k_slice / "test2016.en", 30)[29]
    assert corpus["test"][29]["target"] == head(multi30k_slice / "test2016.de", 30)[29]


def test_text_relative_path_resolved_against_cwd(multi30k_slice, monkeypatch):
    monkeypatch.chdir(multi30k_slice.parent)
    corpus = load_corpus(f"multi30k:{multi30k_slice.name}")
    assert len(corpus["train"]) == 300


def test_text_single_prefix_holds_out_validation_and_test(multi30k_slice):
    spec = f"text:{multi30k_slice / 'train'}:de-en:holdout=25,seed=3"
    corpus, info = load_corpus(spec, return_info=True)
    assert {s: len(d) for s, d in corpus.items()} == {"train": 250, "validation": 25, "test": 25}
    splits = {s: set(zip(d["source"], d["target"])) for s, d in corpus.items()}
    assert not splits["train"] & splits["validation"] and not splits["train"] & splits["test"]
    assert load_corpus(spec)["test"]["source"] == corpus["test"]["source"]  # same seed, same split
    assert info.extra["held_out_from_train"] == {"validation": 25, "test": 25}


def test_tatoeba_tsv_folder_counts(shared_data):
    corpus = load_corpus(f"tsv:{shared_data / 'tatoeba-cmn-eng'}:zh-en")
    assert {s: len(d) for s, d in corpus.items()} == {"train": 26447, "validation": 1000, "test": 1000}
    assert corpus["train"][0] == {"source": "嗨。", "target": "Hi."}


def test_tatoeba_kind_both_directions_with_license():
    folder = tatoeba_dir()  # the shared corpus, else the committed slice of it
    zh_en, info = load_corpus(f"tatoeba:{folder}", return_info=True)
    en_zh = load_corpus(f"tatoeba:{folder}:en-zh")
    sizes = (300, 50, 50) if folder == FIXTURE_TATOEBA else (26447, 1000, 1000)
    assert {s: len(d) for s, d in zh_en.items()} == dict(zip(("train", "validation", "test"), sizes))
    assert zh_en["test"][7] == {"source": en_zh["test"][7]["target"], "target": en_zh["test"][7]["source"]}
    assert (info.source_lang, info.target_lang, info.license) == ("zh", "en", "CC-BY 2.0 FR")
    assert "tatoeba.org" in info.attribution
    with pytest.raises(CorpusError, match="zh-en or en-zh; got de-en"):
        load_corpus(f"tatoeba:{folder}:de-en")


def test_dict_spec_carries_card_metadata():
    spec = {
        "kind": "tsv",
        "location": str(tatoeba_dir()),
        "source_lang": "zh",
        "target_lang": "en",
        "name": "Tatoeba zh-en",
        "license": "CC-BY 2.0 FR",
        "attribution": "Attribution: www.manythings.org/anki and tatoeba.org",
    }
    _, info = load_corpus(spec, return_info=True)
    assert info.summary() == {
        "spec": str(CorpusSpec.coerce(spec)),
        "name": "Tatoeba zh-en",
        "source_lang": "zh",
        "target_lang": "en",
        "license": "CC-BY 2.0 FR",
        "attribution": "Attribution: www.manythings.org/anki and tatoeba.org",
    }


def test_tatoeba_cmn_txt_columns_chosen(tmp_path):
    lines = head(tatoeba_dir() / "cmn.txt", 400)  # en \t zh \t attribution
    path = write_lines(tmp_path / "cmn.txt", lines)
    corpus = load_corpus(f"tsv:{path}:zh-en:src_col=1,tgt_col=0,holdout=20")
    assert sum(len(d) for d in corpus.values()) == 400
    en, zh, _ = lines[0].split("\t")
    every_pair = {(r["source"], r["target"]) for d in corpus.values() for r in d}
    assert (zh, en) in every_pair
    assert not any("CC-BY" in s or "CC-BY" in t for s, t in every_pair)


def test_jsonl_flat_and_nested_layouts(tmp_path):
    rows = [{"de": "Ein Hund läuft.", "en": "A dog runs."}, {"translation": {"de": "Zwei Katzen.", "en": "Two cats."}}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows * 20) + "\n")
    (tmp_path / "dev.jsonl").write_text(json.dumps(rows[0]) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps(rows[1]) + "\n")
    corpus = load_corpus(f"jsonl:{tmp_path}:de-en")
    assert {s: len(d) for s, d in corpus.items()} == {"train": 40, "validation": 1, "test": 1}
    assert corpus["test"][0] == {"source": "Zwei Katzen.", "target": "Two cats."}
    reversed_ = load_corpus(f"jsonl:{tmp_path}:en-de")
    assert reversed_["validation"][0] == {"source": "A dog runs.", "target": "Ein Hund läuft."}


def _saved_hf_dataset(tmp_path: Path, layout: str, pairs: list[tuple[str, str]]) -> Path:
    def split(rows):
        if layout == "translation":
            return datasets.Dataset.from_dict({"translation": [{"de": d, "en": e} for d, e in rows]})
        return datasets.Dataset.from_dict({"german": [d for d, _ in rows], "english": [e for _, e in rows]})

    folder = tmp_path / f"hf_{layout}"
    splits = {"train": split(pairs[:40]), "validation": split(pairs[40:50]), "test": split(pairs[50:60])}
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


def test_hf_translation_layout_from_disk(tmp_path):
    from helpers import read_pairs

    pairs = read_pairs(60)  # real sentences (Multi30k, else the committed Bible pairs), stored as "de"/"en"
    folder = _saved_hf_dataset(tmp_path, "translation", pairs)
    corpus = load_corpus(f"hf:{folder}::de-en")
    assert {s: len(d) for s, d in corpus.items()} == {"train": 40, "validation": 10, "test": 10}
    assert (corpus["test"][0]["source"], corpus["test"][0]["target"]) == pairs[50]
    with pytest.raises(CorpusError, match=r"no language 'fr' .*languages: \['de', 'en'\]"):
        load_corpus(f"hf:{folder}::fr-en")


def test_hf_two_column_layout_and_split_names(tmp_path):
    from helpers import read_pairs

    pairs = read_pairs(60)  # real sentences (Multi30k, else the committed Bible pairs), stored as "de"/"en"
    folder = _saved_hf_dataset(tmp_path, "columns", pairs)
    corpus = load_corpus(f"hf:{folder}::de-en:src_key=german,tgt_key=english,validation=test,test=validation")
    assert (corpus["validation"][0]["source"], corpus["validation"][0]["target"]) == pairs[50]
    with pytest.raises(CorpusError, match=r"no column 'deutsch'; columns: \['german', 'english'\]"):
        load_corpus(f"hf:{folder}:src_key=deutsch,tgt_key=english")
    with pytest.raises(CorpusError, match=r"no split 'dev'; splits: \['test', 'train', 'validation'\]"):
        load_corpus(f"hf:{folder}:src_key=german,tgt_key=english,validation=dev")


def test_hf_local_data_files_folder(tmp_path):
    """A script-free dataset folder (what a Hub repo holds), read by load_dataset offline."""
    folder = tmp_path / "wmt_like"
    folder.mkdir()
    row = {"translation": {"de": "Ein Hund läuft.", "en": "A dog runs."}}
    for split, n in (("train", 30), ("validation", 2), ("test", 3)):
        (folder / f"{split}.jsonl").write_text((json.dumps(row, ensure_ascii=False) + "\n") * n)
    corpus = load_corpus(f"hf:{folder}::en-de", cache_dir=tmp_path / "cache")
    assert {s: len(d) for s, d in corpus.items()} == {"train": 30, "validation": 2, "test": 3}
    assert corpus["test"][0] == {"source": "A dog runs.", "target": "Ein Hund läuft."}
    assert (tmp_path / "cache" / "hf").is_dir()  # nothing written to the user's 🤗 cache


def test_hf_unknown_local_dataset(tmp_path):
    with pytest.raises(CorpusError, match=r"cannot load dataset .*nowhere"):
        load_corpus(f"hf:{tmp_path / 'nowhere'}::de-en", cache_dir=tmp_path / "cache")


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write_lines(tmp_path / "train.de", ["a", "b", "c"])
    write_lines(tmp_path / "train.en", ["a", "b"])
    with pytest.raises(CorpusError) as err:
        load_corpus(f"text:{tmp_path}:de-en")
    message = str(err.value)
    assert f"{tmp_path / 'train.de'} has 3 lines" in message and f"{tmp_path / 'train.en'} has 2 lines" in message


def test_unknown_language_file_lists_languages(multi30k_slice):
    with pytest.raises(CorpusError, match=r"no 'fr' file .*languages found for train: \['de', 'en'\]"):
        load_corpus(f"text:{multi30k_slice}:fr-en")


def test_malformed_tsv_row_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "pairs.tsv", ["嗨。\tHi.", "你好。\tHello.", "no tab here", "好。\tGood."])
    with pytest.raises(CorpusError, match=re.escape(f"{path}, line 3: expected at least 2 tab-separated columns")):
        load_corpus(f"tsv:{path}:zh-en")


def test_tsv_column_beyond_the_row(tmp_path):
    path = write_lines(tmp_path / "pairs.tsv", ["嗨。\tHi."] * 5)
    with pytest.raises(CorpusError, match=r"line 1: expected at least 3 .*src_col=2"):
        load_corpus(f"tsv:{path}:zh-en:src_col=2")


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"de": "a", "en": "b"}\n{"de": "c", "en": \n')
    with pytest.raises(CorpusError, match=re.escape(f"{path}, line 2: not valid JSON")):
        load_corpus(f"jsonl:{path}:de-en")
    path.write_text('{"de": "a", "en": "b"}\n{"de": "c", "english": "d"}\n')
    with pytest.raises(CorpusError, match=r"line 2: key 'en' is missing; keys on this line: \['de', 'english'\]"):
        load_corpus(f"jsonl:{path}:de-en")


def test_missing_location_is_reported(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(f"tsv:{tmp_path / 'nope.tsv'}:zh-en")


# --------------------------------------------------------------------------------------------
# Cleaning and filters
# --------------------------------------------------------------------------------------------


@pytest.fixture
def messy_corpus(tmp_path) -> str:
    train = [
        ("ＡＢＣ  café", "abc café"),  # full-width letters, double space
        ("Ein Hund.", "A dog."),
        ("Ein Hund.", "A dog."),  # duplicate
        ("", "empty source"),  # empty side
        ("eins zwei drei vier fünf sechs", "one"),  # ratio 6
        ("kurz", "short"),
        ("a b c d e f g h i j", "k l m n o p q r s t"),  # 10 words
    ]
    for lang, col in (("de", 0), ("en", 1)):
        write_lines(tmp_path / f"train.{lang}", [p[col] for p in train])
        write_lines(tmp_path / f"dev.{lang}", [p[col] for p in train[:3]])
        write_lines(tmp_path / f"test.{lang}", [p[col] for p in train[:2]])
    return f"text:{tmp_path}:de-en"


def test_no_filters_only_drops_empty_pairs(messy_corpus):
    corpus, info = load_corpus(messy_corpus, return_info=True)
    assert info.counts["train"] == {"read": 7, "empty": 1, "kept": 6}
    assert corpus["train"][0]["source"] == "ＡＢＣ café"  # whitespace folded, nothing else touched


def test_filters_report_counts(messy_corpus):
    filters = CorpusFilters(normalize="NFKC", dedup=True, min_length=1, max_length=8, max_ratio=3.0)
    corpus, info = load_corpus(messy_corpus, filters, return_info=True)
    assert info.counts["train"] == {
        "read": 7,
        "empty": 1,
        "duplicate": 1,
        "too_short": 0,
        "too_long": 1,
        "bad_ratio": 1,
        "kept": 3,
    }
    assert corpus["train"]["source"] == ["ABC café", "Ein Hund.", "kurz"]
    # Only normalization reaches the evaluation splits: the duplicate stays in validation.
    assert corpus["validation"]["source"] == ["ABC café", "Ein Hund.", "Ein Hund."]


def test_overlong_pairs_truncated_when_asked(messy_corpus):
    corpus, info = load_corpus(messy_corpus, {"max_length": 4, "overlong": "truncate"}, return_info=True)
    assert info.counts["train"]["truncated"] == 2
    assert "a b c d" in corpus["train"]["source"] and "k l m n" in corpus["train"]["target"]
    chars = load_corpus(messy_corpus, {"max_length": 3, "length_unit": "chars", "overlong": "truncate"})
    assert all(len(s.replace(" ", "")) <= 3 for s in chars["train"]["source"])


def test_empty_corpus_after_filtering_is_an_error(messy_corpus):
    with pytest.raises(CorpusError, match=r"no training pairs left after filtering: .*'too_short': 6"):
        load_corpus(messy_corpus, {"min_length": 50})


def test_bad_filter_values_are_errors():
    with pytest.raises(CorpusError, match=r"normalize must be one of 'NFC', 'NFKC'"):
        CorpusFilters(normalize="nfd")
    with pytest.raises(CorpusError, match=r"unknown corpus filter\(s\) \['max_len'\]"):
        CorpusFilters.coerce({"max_len": 5})


# --------------------------------------------------------------------------------------------
# Bible: cleaning rules on markup as the modules store it
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        # WEB Gen 1:1: a footnote between two words must leave a space.
        (
            '<w lemma="strong:H0430">God</w><note placement="foot"><reference type="annotateRef">1:1 </reference>'
            'The Hebrew word</note><w lemma="strong:H1254">created</w> the earth. ',
            "God created the earth.",
        ),
        # RV1909 Judg 4:2: inline elements back to back are separate words.
        (
            '<w lemma="strong:H6635">ejército</w><transChange type="added">se llamaba</transChange>'
            '<w lemma="strong:H5516">Sísara</w>, y',
            "ejército se llamaba Sísara, y",
        ),
        # WEB Matt 3:15: the end of a quotation before the next word.
        ('<w>righteousness</w>.”</q><w lemma="strong:G5119">Then</w> he', "righteousness.” Then he"),
        # A note before punctuation leaves no space; headings go, canonical Psalm titles stay.
        ('assaria coins</q> <note placement="foot">An assarion</note> <q marker="">? Not', "assaria coins? Not"),
        (
            '<title type="x-section">Heading</title><div type="x-p"/>Text <title canonical="true">A Psalm.</title>',
            "Text A Psalm.",
        ),
        # The end-of-book marker cuts an appended glossary; KJV's USFM leftovers go.
        ('Amen. <div canonical="true" eID="g1" osisID="Rev" type="book"/> <div type="glossary"/>Aaron: ...', "Amen."),
        ("¶ the \\nd LORD &amp; <divineName>LORD\\+nd*</divineName>:", "the LORD & LORD:"),
        ('<chapter eID="Num.12"/><div eID="gen134" type="x-p"/>', ""),
    ],
)
def test_clean_osis(raw, expected):
    assert clean_osis(raw) == expected


def test_split_units_are_spread_and_rare():
    splits = [split_of_unit(i) for i in range(CHAPTER_PERIOD * 10)]
    assert splits.count("validation") == splits.count("test") == 10


# --------------------------------------------------------------------------------------------
# Bible: the real modules
# --------------------------------------------------------------------------------------------


def _have_bible_modules() -> bool:
    try:
        return set(BIBLE_MODULES) <= set(installed_modules())
    except Exception:  # no SWORD library at all
        return False


bible = pytest.mark.skipif(
    not _have_bible_modules(), reason="SWORD modules sword-text-sparv/sword-text-web not installed"
)


@pytest.fixture(scope="session")
def bible_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bible_cache")


@pytest.fixture(scope="session")
def bible_with_refs(bible_cache):
    """The default Bible pairs with their verse references; the cold read happens here, once."""
    started = time.perf_counter()
    corpus, counts, modules = load_bible("bible", cache_dir=bible_cache)
    print(f"\ncold Bible read + pairing + cache write: {time.perf_counter() - started:.1f} s; counts: {counts}")
    return corpus, counts


@pytest.mark.bible
@bible
def test_bible_pair_counts_and_report(bible_with_refs, bible_cache):
    corpus, info = load_corpus("bible", cache_dir=bible_cache, return_info=True)
    sizes = {s: len(d) for s, d in corpus.items()}
    total = sum(sizes.values())
    verses = info.extra["verses"]
    print(f"bible pairs: {sizes}; verse report: {verses}")
    assert total >= 30_000
    assert 0.01 <= sizes["validation"] / total <= 0.02 and 0.01 <= sizes["test"] / total <= 0.02
    assert corpus["train"].column_names == ["source", "target"]
    # Every source verse is in a pair (maybe merged with a neighbour) or counted as dropped.
    assert verses["source_verses"] == 31102 and verses["pairs"] == total
    assert verses["empty_in_source"] > 0 and verses["empty_in_target"] > 0
    dropped = (
        verses["empty_in_source"]
        + verses["empty_in_both"]
        + verses["missing_in_target"]
        + verses["unaligned_source_verses"]
    )
    assert verses["dropped_source_verses"] == dropped
    assert verses["paired_source_verses"] + dropped == verses["source_verses"]
    assert total <= verses["paired_source_verses"] <= total + 3 * verses["merged_pairs"]
    assert info.summary() == {
        "spec": "bible",
        "name": "Bible RV1909-WEB",
        "source_lang": "es",
        "target_lang": "en",
        "license": "public domain",
        "attribution": info.attribution,
    }
    assert "Reina Valera 1909" in info.attribution and "World English Bible" in info.attribution


@pytest.mark.bible
@bible
def test_bible_chapters_never_straddle_splits(bible_with_refs):
    corpus, _ = bible_with_refs
    split_of_chapter = defaultdict(set)
    for split, dataset in corpus.items():
        for ref, target_ref in zip(dataset["ref"], dataset["target_ref"]):
            split_of_chapter[ref.rsplit(".", 1)[0]].add(split)
            split_of_chapter[target_ref.rsplit(".", 1)[0]].add(split)
    straddling = {c: s for c, s in split_of_chapter.items() if len(s) > 1}
    assert not straddling
    held_out = {c for c, s in split_of_chapter.items() if s != {"train"}}
    assert {c.split(".")[0] for c in held_out} & {"Gen", "Exod", "Ps", "Isa"}  # spread over the Bible ...
    assert {c.split(".")[0] for c in held_out} & {"Matt", "Luke", "John", "Acts", "Rom", "Rev"}  # ... both testaments


@pytest.mark.bible
@bible
def test_bible_cache_is_reused_and_deterministic(bible_with_refs, bible_cache):
    corpus, _ = bible_with_refs
    started = time.perf_counter()
    again, _, _ = load_bible("bible", cache_dir=bible_cache)
    print(f"warm Bible load: {time.perf_counter() - started:.2f} s")
    assert time.perf_counter() - started < 5
    assert again["test"]["ref"] == corpus["test"]["ref"]
    assert len(list((bible_cache / "bible").iterdir())) == 1  # one cache folder, no leftovers


@pytest.mark.bible
@bible
def test_bible_text_is_clean(bible_with_refs):
    corpus, _ = bible_with_refs
    texts = [t for d in corpus.values() for column in ("source", "target") for t in d[column]]
    markup = [t for t in texts if re.search(r"[<>\\]|strong:|&[a-z]+;|¶", t)]
    assert not markup, markup[:3]
    # Words glued by markup removal look like "ejércitose" or "saidTo": a lower-case letter
    # directly followed by an upper-case one, or a letter right after sentence punctuation.
    glued = [t for t in texts if re.search(r"[a-záéíóúñ][A-ZÁÉÍÓÚÑ]|[a-z][.,;:!?][A-Za-z]", t)]
    assert not glued, glued[:3]
    assert all(t == t.strip() and "  " not in t for t in texts)


@pytest.mark.bible
@bible
def test_bible_known_verses(bible_with_refs):
    corpus, _ = bible_with_refs
    by_ref = {}
    for d in corpus.values():
        by_ref.update({r: (s, t, tr) for r, s, t, tr in zip(d["ref"], d["source"], d["target"], d["target_ref"])})
    assert by_ref["Gen.1.1"][:2] == (
        "EN el principio crió Dios los cielos y la tierra.",
        "In the beginning, God created the heavens and the earth.",
    )
    assert "ejército se llamaba Sísara" in by_ref["Judg.4.2"][0]
    assert by_ref["Rev.22.21"][1] == "The grace of the Lord Jesus Christ be with all the saints. Amen."  # no glossary
    assert by_ref["Ps.3.1"][1].startswith("A Psalm by David, when he fled from Absalom his son.")
    # RV1909 numbers Numbers 13 one verse later than WEB: re-aligned, not paired by number.
    assert by_ref["Num.13.2"] == ("Y Jehová habló á Moisés, diciendo:", "Yahweh spoke to Moses, saying,", "Num.13.1")
    assert by_ref["Num.13.1"][2] == "Num.12.16" and "Hazeroth" in by_ref["Num.13.1"][1]
    assert by_ref["Jonah.2.1"][2] == "Jonah.1.17"
    # WEB leaves out Acts 8:37: the Spanish verse is dropped and 8:38 still pairs with 8:38.
    assert "Acts.8.37" not in by_ref and by_ref["Acts.8.38"][2] == "Acts.8.38"


@pytest.mark.bible
@bible
def test_kjv_is_selectable_and_cleaned():
    module = find_module("kjv")
    assert module.name == "engKJV2006eb" and module.language == "en"
    verses = list(read_verses(module, {"Exod"}))
    assert len(verses) == 1213
    texts = [t for *_, t in verses]
    assert not [t for t in texts if re.search(r"[<>\\¶]|strong:", t)]
    assert "\\nd" not in " ".join(texts) and any("LORD" in t for t in texts)


def test_missing_sword_module_names_the_debian_package(tmp_path, monkeypatch):
    (tmp_path / "mods.d").mkdir()
    monkeypatch.setenv("SWORD_PATH", str(tmp_path))
    expected = r"'spaRV1909eb' is not installed; install it with `apt-get install sword-text-sparv`"
    with pytest.raises(CorpusError, match=expected):
        load_corpus("bible", cache_dir=tmp_path / "cache")
    with pytest.raises(CorpusError, match=r"apt-get install sword-text-kjv"):
        load_corpus("bible:src=kjv,tgt=web", cache_dir=tmp_path / "cache")


@pytest.mark.bible
@bible
def test_unknown_sword_module_lists_installed_ones():
    with pytest.raises(CorpusError, match=r"'nosuchbible' is not installed.*installed: .*spaRV1909eb \(RV1909\)"):
        load_corpus("bible:tgt=nosuchbible")
    with pytest.raises(CorpusError, match=r"no default Bible module for language 'fr'; languages: \['en', 'es'\]"):
        load_corpus("bible:fr-en")


def test_a_new_named_corpus_is_one_preset_entry_read_by_the_loader_and_the_card(tmp_path, monkeypatch):
    # A Europarl-like folder of line-aligned files: one CorpusPreset makes "europarl:<dir>" a kind
    # with its default languages, name, licence and attribution, and the model card's terms.
    from transformers import GenerationConfig

    from attention_seq2seq import RNNSeq2SeqConfig
    from attention_seq2seq.data.presets import PRESETS, CorpusPreset
    from attention_seq2seq.hub.model_card import render_model_card

    monkeypatch.setitem(
        PRESETS,
        "europarl",
        CorpusPreset(
            kind="europarl",
            format="text",
            default_pair=("fr", "en"),
            name="Europarl {src}-{tgt}",
            license="public (EU reuse notice)",
            attribution="Koehn (2005)",
            card_license={"license": "cc-by-4.0"},
            limitation="- Parliament proceedings only.",
        ),
    )
    for split in ("train", "dev", "test"):
        write_lines(tmp_path / f"{split}.fr", [f"phrase {i}" for i in range(5)])
        write_lines(tmp_path / f"{split}.en", [f"sentence {i}" for i in range(5)])
    corpus, info = load_corpus(f"europarl:{tmp_path}", return_info=True)
    assert len(corpus["train"]) == 5 and corpus["validation"][0] == {"source": "phrase 0", "target": "sentence 0"}
    assert (info.name, info.source_lang, info.target_lang, info.license, info.attribution, info.preset) == (
        "Europarl fr-en",
        "fr",
        "en",
        "public (EU reuse notice)",
        "Koehn (2005)",
        "europarl",
    )
    with pytest.raises(CorpusError, match="valid options: train, validation, test, holdout, seed, name"):
        load_corpus(f"europarl:{tmp_path}:fr-en:src_col=1")
    metrics = {"corpus": {k: v for k, v in info.to_dict().items() if k not in ("counts", "extra")}}
    card = render_model_card(
        RNNSeq2SeqConfig(vocab_size=40, embedding_size=8, hidden_size=8),
        GenerationConfig(num_beams=2),
        metrics,
        None,
        "someone/model",
    )
    # no corpora.md section of its own yet: the generic one, with the preset's terms and limitation
    assert "license: cc-by-4.0" in card and "Parliament proceedings only." in card
    assert "Its license, as recorded at training time: public (EU reuse notice)." in card
