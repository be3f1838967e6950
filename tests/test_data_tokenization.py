"""Tests for attention_seq2seq.data.tokenization: special ids, EOS, exact round trips in de/en/zh/es.

Tokenizers are trained on slices of the shared corpora (and two Bible books for Spanish) and
tested on held-out sentences. Without ../shared/data the Latin-script checks run on Spanish-English
(the Bible: SWORD modules, else the committed pairs in tests/fixtures) and the Chinese ones on the
committed Tatoeba slice (tests/fixtures/tatoeba-cmn-eng: 300 train, 50 test pairs).
No test touches the network.
"""

from __future__ import annotations

import time

import datasets
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from attention_seq2seq.data import SeparateTokenizers, load_corpus, train_tokenizer
from attention_seq2seq.data.bible import find_module, installed_modules, read_verses
from attention_seq2seq.data.tokenization import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SubwordSampler
from helpers import FIXTURE_PAIRS, FIXTURE_TATOEBA, shared_data_dir, tatoeba_dir

MODEL_TYPES = ("unigram", "bpe")

# Every test here runs offline and without progress bars (fixtures in conftest.py).
pytestmark = pytest.mark.usefixtures("no_network", "quiet_datasets")


def _every(dataset: datasets.Dataset, step: int, n: int) -> list[tuple[str, str]]:
    """n pairs spread over the dataset (Tatoeba is sorted by length; a head would be all short)."""
    rows = dataset.select(range(0, min(len(dataset), step * n), step))
    return list(zip(rows["source"], rows["target"]))


@pytest.fixture(scope="module")
def corpora() -> dict[str, dict[str, list[tuple[str, str]]]]:
    """Per language pair: 'train' slice to train on, 'heldout' sentences to round-trip. de-en and
    come from ../shared/data when it is there (zh-en else from the committed Tatoeba slice); es-en
    from the Bible."""
    shared = shared_data_dir()
    out = {}
    if (shared / "multi30k" / "train.en").exists():
        multi30k = load_corpus(f"multi30k:{shared / 'multi30k'}")
        out["de-en"] = {"train": _every(multi30k["train"], 7, 4000), "heldout": _every(multi30k["test"], 1, 200)}
    tatoeba_folder = tatoeba_dir()
    tatoeba = load_corpus(f"tsv:{tatoeba_folder}:zh-en")
    step = 1 if tatoeba_folder == FIXTURE_TATOEBA else 6  # the fixture's train split: all 300 pairs
    out["zh-en"] = {"train": _every(tatoeba["train"], step, 4000), "heldout": _every(tatoeba["test"], 1, 1000)}
    if {"spaRV1909eb", "engWEB2015eb"} <= set(installed_modules()):
        spanish, english = find_module("spaRV1909eb"), find_module("engWEB2015eb")

        def book_pairs(books):
            es = {(b, c, v): t for b, c, v, t in read_verses(spanish, books)}
            en = {(b, c, v): t for b, c, v, t in read_verses(english, books)}
            return [(es[k], en[k]) for k in es if es[k] and en.get(k)]

        out["es-en"] = {"train": book_pairs({"Gen", "Matt"}), "heldout": book_pairs({"Ruth"})}
    elif "de-en" not in out:
        fixture = load_corpus(f"text:{FIXTURE_PAIRS}:es-en")
        out["es-en"] = {"train": _every(fixture["train"], 1, 1500), "heldout": _every(fixture["test"], 1, 100)}
    return out


@pytest.fixture(scope="module")
def latin(corpora) -> str:
    """The Latin-script pair the German checks run on: de-en (Multi30k), else es-en."""
    return "de-en" if "de-en" in corpora else "es-en"


def _needs(corpora, pair: str) -> None:
    if pair not in corpora:
        reason = "SWORD modules for Spanish not installed" if pair == "es-en" else f"{pair} needs ../shared/data"
        pytest.skip(reason)


@pytest.fixture(scope="module")
def tokenizers(corpora) -> dict[tuple[str, str], PreTrainedTokenizerFast]:
    return {
        (pair, model_type): train_tokenizer(data["train"], vocab_size=4000, model_type=model_type)
        for pair, data in corpora.items()
        for model_type in MODEL_TYPES
    }


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_special_token_ids_and_eos(tokenizers, latin, model_type):
    tok = tokenizers[(latin, model_type)]
    ids = (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id)
    assert ids == (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    encoded = tok("Ein Hund läuft.", text_target="A dog runs.")
    assert encoded["input_ids"][-1] == EOS_ID and encoded["labels"][-1] == EOS_ID
    assert BOS_ID not in encoded["input_ids"] and BOS_ID not in encoded["labels"]
    assert encoded["input_ids"].count(EOS_ID) == 1 and encoded["attention_mask"] == [1] * len(encoded["input_ids"])
    assert tok("Ein Hund läuft.", add_special_tokens=False)["input_ids"] == encoded["input_ids"][:-1]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("pair", ["de-en", "zh-en", "es-en"])
def test_exact_round_trip_on_heldout_sentences(corpora, tokenizers, pair, model_type):
    _needs(corpora, pair)
    tok = tokenizers[(pair, model_type)]
    for column, lang in enumerate(pair.split("-")):
        sentences = [p[column] for p in corpora[pair]["heldout"]]
        ids = [tok(s)["input_ids"] for s in sentences]
        decoded = [tok.decode(i, skip_special_tokens=True) for i in ids]
        wrong = [(s, d) for s, d in zip(sentences, decoded) if s != d]
        assert not wrong, f"{lang}: {len(wrong)} of {len(sentences)} differ, e.g. {wrong[:2]}"
        assert not any(UNK_ID in i for i in ids)  # byte fallback, never <unk>
        # Batched and padded: padding and </s> vanish, nothing else changes.
        batch = tok(sentences[:32], padding=True)["input_ids"]
        assert PAD_ID in {i for row in batch for i in row}
        assert tok.batch_decode(batch, skip_special_tokens=True) == sentences[:32]


def test_punctuation_and_chinese_get_no_stray_spaces(tokenizers, latin):
    cases = {
        latin: ["Ein Mann (mit Hut) sagt: „Hallo!“ – dann geht er.", "He's here, isn't he? Yes: 3.5 km/h."],
        "zh-en": ["我們明天早上七點出發，好嗎？", "「你好！」他說。"],
    }
    for pair, sentences in cases.items():
        tok = tokenizers[(pair, "unigram")]
        for s in sentences:
            assert tok.decode(tok(s)["input_ids"], skip_special_tokens=True) == s


def test_chinese_is_segmented_by_the_subword_model(corpora, tokenizers):
    _needs(corpora, "zh-en")
    tok = tokenizers[("zh-en", "unigram")]
    chinese = [p[0] for p in corpora["zh-en"]["heldout"][:300]]
    pieces = [tok.convert_ids_to_tokens(tok(s, add_special_tokens=False)["input_ids"]) for s in chinese]
    words = {p.lstrip("▁") for row in pieces for p in row if not p.startswith("<0x")}
    multi_char = {w for w in words if len(w) >= 2}
    # A tokenizer fed pre-split characters learns none; 300 shared test sentences show over 50 (1 in 6).
    assert len(multi_char) > len(chinese) / 6, (
        "no multi-character Chinese pieces learned: the text was pre-split into characters"
    )
    # Words of several characters are single pieces: the text the vocabulary covers (all pieces but
    # byte fallbacks, which spell one character in three pieces: many on the 300-pair fixture) takes
    # fewer pieces than it has characters.
    known = [p for row in pieces for p in row if not p.startswith("<0x") and p != "▁"]
    covered = sum(len(p.lstrip("▁")) for p in known)
    print(f"zh: {len(known)} pieces for the {covered} characters not spelled in bytes")
    assert len(known) < covered
    chars = sum(len(s) for s in chinese)
    tokens = sum(len(row) for row in pieces)
    print(f"zh: {tokens} tokens for {chars} characters")
    if len(corpora["zh-en"]["train"]) > 1000:  # the shared corpus: few characters unseen in training
        assert tokens < chars


def test_unseen_characters_fall_back_to_bytes(tokenizers, latin):
    tok = tokenizers[(latin, "bpe")]
    text = "Ein Drache 龍 und ein Emoji 🐉 im Bild."
    ids = tok(text)["input_ids"]
    assert UNK_ID not in ids
    assert any(t.startswith("<0x") for t in tok.convert_ids_to_tokens(ids))
    assert tok.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_save_and_load_with_autotokenizer(tokenizers, corpora, latin, tmp_path, model_type):
    pair = "zh-en" if "zh-en" in corpora else latin
    tok = tokenizers[(pair, model_type)]
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(loaded, PreTrainedTokenizerFast)
    sources = [p[0] for p in corpora[pair]["heldout"][:50]]
    targets = [p[1] for p in corpora[pair]["heldout"][:50]]
    assert loaded(sources, text_target=targets)["labels"] == tok(sources, text_target=targets)["labels"]
    assert loaded(sources)["input_ids"] == tok(sources)["input_ids"]
    assert loaded.batch_decode(loaded(sources)["input_ids"], skip_special_tokens=True) == sources
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2, 3)
    assert len(loaded) == len(tok)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_vocab_size_is_respected(tokenizers, latin, model_type):
    tok = tokenizers[(latin, model_type)]
    assert 0.9 * 4000 <= len(tok) <= 4000


def test_separate_vocabularies(corpora, tmp_path):
    _needs(corpora, "zh-en")
    pair = train_tokenizer(corpora["zh-en"]["train"], vocab_size=3000, joint=False)
    assert isinstance(pair, SeparateTokenizers)
    source, target = pair
    chinese, english = corpora["zh-en"]["heldout"][0]
    for tok in (source, target):
        assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    # The English-only target vocabulary has no Chinese pieces: it spells Chinese in bytes.
    target_pieces = target.convert_ids_to_tokens(target(chinese, add_special_tokens=False)["input_ids"])
    assert all(p.startswith("<0x") or p == "▁" for p in target_pieces)
    assert len(source(chinese)["input_ids"]) < len(target(chinese)["input_ids"])
    assert len(target(english)["input_ids"]) < len(source(english)["input_ids"])
    pair.save_pretrained(tmp_path)
    loaded = SeparateTokenizers.from_pretrained(tmp_path)
    assert loaded.source(chinese)["input_ids"] == source(chinese)["input_ids"]
    assert loaded.target.decode(target(english)["input_ids"], skip_special_tokens=True) == english


def test_training_on_a_full_corpus_fills_the_vocabulary(shared_data):
    """The whole Multi30k train split (29,000 pairs): its time is printed, never asserted (a busy
    machine is slower; benchmarks/bench_data.py times it against a peer)."""
    corpus = load_corpus(f"multi30k:{shared_data / 'multi30k'}")
    started = time.perf_counter()
    tok = train_tokenizer(corpus, vocab_size=8000)  # the DatasetDict: its train split only
    print(f"unigram, 8000 pieces, {len(corpus['train'])} pairs: {time.perf_counter() - started:.1f} s")
    assert len(tok) > 7000
    pieces = tok.convert_ids_to_tokens(tok("Ein Mann fährt Fahrrad.")["input_ids"])
    assert tok.unk_token not in pieces and len(pieces) > 2


def test_bad_arguments_are_errors(corpora, latin):
    data = corpora[latin]["train"][:100]
    with pytest.raises(ValueError, match=r"model_type must be one of 'unigram', 'bpe'; got 'wordpiece'"):
        train_tokenizer(data, 1000, model_type="wordpiece")
    with pytest.raises(ValueError, match=r"vocab_size must be at least 300"):
        train_tokenizer(data, 100)
    with pytest.raises(ValueError, match=r"missing \['target'\]"):
        train_tokenizer(datasets.Dataset.from_dict({"source": ["a"], "tgt": ["b"]}), 1000)
    with pytest.raises(ValueError, match="needs a 'train' split"):
        only_test = datasets.DatasetDict({"test": datasets.Dataset.from_dict({"source": ["a"], "target": ["b"]})})
        train_tokenizer(only_test, 1000)


# --------------------------------------------------------------------------------------------
# Subword regularization (SubwordSampler)
# --------------------------------------------------------------------------------------------

SAMPLING = {"unigram": {"alpha": 0.2}, "bpe": {"dropout": 0.2}}


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_sampled_segmentations_vary_but_spell_the_same_text(corpora, tokenizers, latin, model_type):
    tok = tokenizers[(latin, model_type)]
    sentences = [p[0] for p in corpora[latin]["heldout"]]
    best = [tok(s)["input_ids"] for s in sentences]
    sampler = SubwordSampler(tok, **SAMPLING[model_type])
    first, second = sampler.encode(sentences), sampler.encode(sentences)  # two epochs of one sampler
    assert sampler.encode(sentences, side="target") != first  # (one tokenizer, both sides sampled)
    for sample in (first, second):
        assert [tok.decode(i, skip_special_tokens=True) for i in sample] == sentences
        assert all(ids[-1] == EOS_ID and ids.count(EOS_ID) == 1 for ids in sample)
        # more, shorter pieces than the best segmentation, on average
        assert sum(map(len, sample)) > 1.05 * sum(map(len, best))
    differ = sum(a != b for a, b in zip(first, second))
    assert differ > 0.5 * len(sentences)  # two draws disagree on most sentences
    assert [tok(s)["input_ids"] for s in sentences] == best  # the run's tokenizer stays deterministic


def test_unigram_sampling_gets_closer_to_the_best_segmentation_as_alpha_grows(corpora, tokenizers, latin):
    tok = tokenizers[(latin, "unigram")]
    sentences = [p[1] for p in corpora[latin]["heldout"]]
    best = sum(len(tok(s)["input_ids"]) for s in sentences)
    lengths = [sum(map(len, SubwordSampler(tok, alpha=a).encode(sentences))) / best for a in (0.1, 0.5, 1.0)]
    assert lengths[0] > lengths[1] > lengths[2] >= 1.0 and lengths[2] < 1.02, lengths
    # among the 2 best segmentations only: closer still to the best one than the whole lattice
    nbest = sum(map(len, SubwordSampler(tok, alpha=0.1, nbest_size=2).encode(sentences))) / best
    assert 1.0 <= nbest < lengths[0]


def test_resample_keeps_the_best_segmentation_of_a_side_over_its_limit(corpora, tokenizers, latin):
    tok = tokenizers[(latin, "unigram")]
    pairs = corpora[latin]["heldout"][:50]
    sources, targets = [p[0] for p in pairs], [p[1] for p in pairs]
    best_src, best_tgt = [tok(s)["input_ids"] for s in sources], [tok(t)["input_ids"] for t in targets]
    limit = max(len(i) for i in best_src + best_tgt)  # every best segmentation fits, many samples do not
    input_ids, labels, kept = SubwordSampler(tok, alpha=0.1).resample(
        sources, targets, best_src, best_tgt, limit, limit
    )
    assert all(len(i) <= limit for i in input_ids + labels)
    fallbacks = sum(a is b for a, b in zip(input_ids + labels, best_src + best_tgt))
    assert kept == fallbacks > 0
    assert [tok.decode(i, skip_special_tokens=True) for i in input_ids] == sources
    with pytest.raises(ValueError, match="one entry per pair; got 50, 49, 50, 50"):
        SubwordSampler(tok, alpha=0.1).resample(sources, targets[:-1], best_src, best_tgt, limit, limit)


def test_subword_sampling_options_must_fit_the_tokenizer(tokenizers, latin):
    unigram, bpe = tokenizers[(latin, "unigram")], tokenizers[(latin, "bpe")]
    with pytest.raises(ValueError, match="alpha needs a Unigram tokenizer; this one is BPE"):
        SubwordSampler(bpe, alpha=0.1)
    with pytest.raises(ValueError, match="dropout needs a BPE tokenizer; this one is Unigram"):
        SubwordSampler(unigram, dropout=0.1)
    with pytest.raises(ValueError, match="needs alpha .* or dropout"):
        SubwordSampler(unigram)
    with pytest.raises(ValueError, match="not both"):
        SubwordSampler(unigram, alpha=0.1, dropout=0.1)
    with pytest.raises(ValueError, match="alpha must be > 0; got 0"):
        SubwordSampler(unigram, alpha=0)
    with pytest.raises(ValueError, match="alpha above 1 needs nbest_size"):
        SubwordSampler(unigram, alpha=2.0)
    SubwordSampler(unigram, alpha=2.0, nbest_size=8).encode(["Ein Hund läuft."])
    with pytest.raises(ValueError, match="nbest_size needs alpha and must be at least 2"):
        SubwordSampler(unigram, alpha=0.1, nbest_size=1)
    with pytest.raises(ValueError, match=r"dropout must be in \(0, 1\); got 1.0"):
        SubwordSampler(bpe, dropout=1.0)


@pytest.mark.bible
@pytest.mark.skipif(
    not {"spaRV1909eb", "engWEB2015eb"} <= set(installed_modules()),
    reason="needs Debian's sword-text-sparv and sword-text-web (scripts/install.sh installs them)",
)
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_training_twice_on_the_same_text_gives_the_same_tokenizer(model_type):
    # The unigram trainer's threads sum scores in no fixed order (last-bit differences) and
    # spell rare characters in hash-map order; before canonicalising, three trainings on these
    # 3,000 verses gave three different files, and so different ids for the same model.
    datasets.disable_progress_bars()
    verses = load_corpus("bible:es-en")["train"].select(range(3000))
    files = {train_tokenizer(verses, 2000, model_type=model_type).backend_tokenizer.to_str() for _ in range(3)}
    assert len(files) == 1
