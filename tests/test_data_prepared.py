"""Prepared corpora (data/prepared.py): memory-mapped pairs give the same items, lengths, batches
and collated tensors as the in-memory route on the committed Bible pairs; the cache is reused,
rebuilt when a file or option changes, built once under concurrency; the tokenizer sample."""

from __future__ import annotations

import os
import shutil
import threading

import numpy as np
import pytest
import torch

from attention_seq2seq.data import prepared as prep
from attention_seq2seq.data.batching import TokenBudgetBatchSampler, tokenize_dataset
from attention_seq2seq.data.corpora import load_corpus
from attention_seq2seq.data.pairs import Collate, PairDataset
from attention_seq2seq.data.prepared import PreparedPairs, prepare_corpus, tokenizer_sample, write_pairs
from attention_seq2seq.data.tokenization import train_tokenizer

from helpers import FIXTURE_PAIRS

MAX_LEN = 40  # below the longest fixture verses, so the filter drops some pairs


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A private copy of the Bible fixture (tests touch its files)."""
    folder = tmp_path_factory.mktemp("bible")
    for path in FIXTURE_PAIRS.iterdir():
        if path.suffix in (".es", ".en"):
            shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(corpus_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    train_tokenizer(load_corpus(f"text:{corpus_dir}:es-en")["train"], 500).save_pretrained(folder)
    return folder


def spec(folder) -> str:
    return f"text:{folder}:es-en"


def old_route(folder, tokenizer_dir):
    """Today's trainer route: tokenize_dataset(overlong='filter') and PairDataset of Python lists."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    data = tokenize_dataset(load_corpus(spec(folder)), tokenizer, MAX_LEN, MAX_LEN, overlong="filter")
    return PairDataset(data["train"]["input_ids"][:], data["train"]["labels"][:]), data, tokenizer


def test_write_and_read_pairs(tmp_path):
    source = [[5, 6, 2], [7, 2], [2]]
    target = [[8, 2], [9, 10, 11, 2], [12, 2]]
    assert write_pairs(tmp_path, [(source[:2], target[:2]), (source[2:], target[2:])]) == 3
    pairs = PreparedPairs(tmp_path)
    assert len(pairs) == 3
    assert [pairs[i] for i in range(3)] == [
        {"input_ids": s, "labels": t, "id": i} for i, (s, t) in enumerate(zip(source, target))
    ]
    assert pairs[-1]["id"] == 2
    np.testing.assert_array_equal(pairs.lengths(), [[3, 2], [2, 4], [1, 2]])
    assert pairs.column("target") == target
    with pytest.raises(IndexError, match="pair 3 out of range for 3 pairs"):
        pairs[3]
    # a truncated token file is refused, not read past its end
    path = tmp_path / "source_tokens.bin"
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(ValueError, match="source_offsets.npy does not fit source_tokens.bin"):
        PreparedPairs(tmp_path)


def test_prepared_pairs_match_the_in_memory_route(corpus_dir, tokenizer_dir, tmp_path):
    old, old_data, tokenizer = old_route(corpus_dir, tokenizer_dir)
    new = prepare_corpus(
        spec(corpus_dir),
        tokenizer_path=str(tokenizer_dir),
        max_source_length=MAX_LEN,
        max_target_length=MAX_LEN,
        root=tmp_path,
    )
    train = new.train
    assert 0 < len(train) == len(old) < 1500  # some pairs were over the limit and dropped
    assert new.meta["train_pairs_dropped"] == 1500 - len(old)
    assert train.column("source") == old.input_ids and train.column("target") == old.labels
    np.testing.assert_array_equal(train.lengths(), old.lengths())
    for split in ("validation", "test"):  # truncated, never filtered: the same columns
        assert new.splits[split]["input_ids"][:] == old_data[split]["input_ids"][:]
        assert new.splits[split]["target"][:] == old_data[split]["target"][:]

    # same sampler batches for the first epochs, and the same collated tensors
    collate = Collate(tokenizer.pad_token_id, tokenizer.bos_token_id)
    samplers = [
        TokenBudgetBatchSampler(d.lengths(), max_tokens=400, seed=3, num_replicas=2, rank=1) for d in (old, train)
    ]
    for epoch in range(3):
        batches = [s.global_batches(epoch) for s in samplers]
        assert batches[0] == batches[1]
        loaders = [
            torch.utils.data.DataLoader(d, batch_sampler=s, collate_fn=collate) for d, s in zip((old, train), samplers)
        ]
        for s in samplers:
            s.set_epoch(epoch)
        for a, b in zip(*loaders):
            assert a.keys() == b.keys()
            for key in a:
                assert torch.equal(a[key], b[key]), key


def test_training_tokenizer_is_the_same_as_training_it_directly(corpus_dir, tmp_path):
    new = prepare_corpus(
        spec(corpus_dir), vocab_size=500, max_source_length=MAX_LEN, max_target_length=MAX_LEN, root=tmp_path
    )
    direct = train_tokenizer(load_corpus(spec(corpus_dir))["train"], 500)
    from transformers import PreTrainedTokenizerFast

    cached = PreTrainedTokenizerFast.from_pretrained(new.tokenizer_dir)
    assert cached.get_vocab() == direct.get_vocab()


def test_cache_is_reused_and_rebuilt_on_change(corpus_dir, tokenizer_dir, tmp_path):
    kwargs = dict(
        tokenizer_path=str(tokenizer_dir), max_source_length=MAX_LEN, max_target_length=MAX_LEN, root=tmp_path
    )
    first = prepare_corpus(spec(corpus_dir), **kwargs)
    assert first.built
    again = prepare_corpus(spec(corpus_dir), **kwargs)
    assert not again.built and again.folder == first.folder
    # another length limit: new prepared data, the same tokenizer entry
    longer = prepare_corpus(spec(corpus_dir), **{**kwargs, "max_source_length": MAX_LEN + 10})
    assert longer.built and longer.folder != first.folder and longer.tokenizer_dir == first.tokenizer_dir
    # a changed file (size and mtime): a new entry, with the new pair in it
    path = corpus_dir / "train.es"
    saved = path.read_bytes()
    try:
        with open(corpus_dir / "train.en", "a") as f_en, open(path, "a") as f_es:
            f_en.write("a new verse\n")
            f_es.write("un versículo nuevo\n")
        changed = prepare_corpus(spec(corpus_dir), **kwargs)
        assert changed.built and changed.folder.parent != first.folder.parent
        assert len(changed.train) == len(first.train) + 1
    finally:
        path.write_bytes(saved)
        (corpus_dir / "train.en").write_bytes((FIXTURE_PAIRS / "train.en").read_bytes())


def test_concurrent_preparations_build_once(corpus_dir, tokenizer_dir, tmp_path, monkeypatch):
    calls = []
    real = prep.encode_training_pairs

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(prep, "encode_training_pairs", counting)
    results = []

    def run():
        results.append(
            prepare_corpus(
                spec(corpus_dir),
                tokenizer_path=str(tokenizer_dir),
                max_source_length=MAX_LEN,
                max_target_length=MAX_LEN,
                root=tmp_path,
            )
        )

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 3
    assert sum(r.built for r in results) == 1 and len({r.folder for r in results}) == 1
    assert not [p for p in results[0].folder.parent.iterdir() if ".tmp-" in p.name]  # no leftovers


def test_failed_build_leaves_no_entry(tmp_path):
    def broken(folder):
        (folder / "half").write_text("x")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        prep.build_once(tmp_path / "entry", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.lock"]


def test_tokenizer_sample():
    assert tokenizer_sample(100, None) is None and tokenizer_sample(100, 100) is None
    a = tokenizer_sample(1000, 50)
    assert len(a) == 50 == len(set(a.tolist())) and list(a) == sorted(a) and a.max() < 1000
    np.testing.assert_array_equal(a, tokenizer_sample(1000, 50))  # seeded: the same sample every run
    with pytest.raises(ValueError, match="tokenizer_train_pairs must be positive"):
        tokenizer_sample(10, 0)


def test_cache_root_honours_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTENTION_SEQ2SEQ_CACHE", str(tmp_path))
    assert prep.cache_root() == tmp_path / "corpora"
    monkeypatch.delenv("ATTENTION_SEQ2SEQ_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert prep.cache_root() == tmp_path / "xdg" / "attention_seq2seq" / "corpora"
    assert os.path.basename(str(prep.cache_root())) == "corpora"


@pytest.mark.parametrize("kind", ["text", "tsv", "jsonl"])
def test_large_splits_are_streamed_to_arrow_files_with_the_same_pairs(kind, tmp_path, monkeypatch):
    """Above SPILL_PAIRS a split is written to a memory-mapped Arrow file and cleaned into files;
    the pairs and counts are those of the in-memory route."""
    import json

    from attention_seq2seq.data import corpora

    sources = (FIXTURE_PAIRS / "train.es").read_text(encoding="utf-8").splitlines()
    targets = (FIXTURE_PAIRS / "train.en").read_text(encoding="utf-8").splitlines()
    sources[5] = "  spaced   out\tverse "  # cleaning must still run on the streamed split
    if kind == "text":
        (tmp_path / "train.es").write_text("\n".join(sources) + "\n", encoding="utf-8")
        (tmp_path / "train.en").write_text("\n".join(targets) + "\n", encoding="utf-8")
        corpus = f"text:{tmp_path}:es-en"
    elif kind == "tsv":
        (tmp_path / "train.tsv").write_text(
            "".join(f"{s.replace(chr(9), ' ')}\t{t}\n" for s, t in zip(sources, targets)), encoding="utf-8"
        )
        corpus = f"tsv:{tmp_path}:es-en"
    else:
        (tmp_path / "train.jsonl").write_text(
            "".join(json.dumps({"es": s, "en": t}) + "\n" for s, t in zip(sources, targets)), encoding="utf-8"
        )
        corpus = f"jsonl:{tmp_path}:es-en"
    filters = {"max_length": 30, "overlong": "truncate"}
    small = load_corpus(corpus, filters=filters, return_info=True)
    monkeypatch.setattr(corpora, "SPILL_PAIRS", 100)
    large = load_corpus(corpus, filters=filters, return_info=True)
    assert large[0]["train"].cache_files  # memory-mapped files, not an in-memory table
    assert not small[0]["train"].cache_files
    for column in ("source", "target"):
        assert large[0]["train"][column][:] == small[0]["train"][column][:]
    assert large[1].counts == small[1].counts


def test_streamed_text_files_of_different_lengths_name_both_counts(tmp_path, monkeypatch):
    from attention_seq2seq.data import corpora
    from attention_seq2seq.data.spec import CorpusError

    monkeypatch.setattr(corpora, "SPILL_PAIRS", 2)
    (tmp_path / "train.es").write_text("a\nb\nc\nd\ne\n")
    (tmp_path / "train.en").write_text("a\nb\nc\n")
    with pytest.raises(CorpusError, match=r"train.es has 5 lines, .*train.en has 3 lines"):
        load_corpus(f"text:{tmp_path}:es-en")


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_word_cache_encoder_gives_the_tokenizers_ids(model_type, corpus_dir):
    from attention_seq2seq.data.prepared import WordCacheEncoder, encode_texts

    train = load_corpus(spec(corpus_dir))["train"]
    tokenizer = train_tokenizer(train, 400, model_type=model_type)
    texts = train["source"][:] + train["target"][:]
    encoder = WordCacheEncoder(tokenizer, verify=0)
    assert encoder.usable
    expected = encode_texts(tokenizer, texts)
    assert expected == tokenizer(texts)["input_ids"]
    for chunk in (texts[:700], texts[700:]):  # the second chunk reads most words from the cache
        flat, lengths = encoder.encode(chunk)
        rows = np.split(flat, np.cumsum(lengths)[:-1])
        assert [r.tolist() for r in rows] == expected[: len(chunk)]
        expected = expected[len(chunk) :]


def test_word_cache_encoder_falls_back_for_other_pipelines(corpus_dir):
    from tokenizers import normalizers

    from attention_seq2seq.data.prepared import WordCacheEncoder

    tokenizer = train_tokenizer(load_corpus(spec(corpus_dir))["train"], 400)
    tokenizer.backend_tokenizer.normalizer = normalizers.Lowercase()
    encoder = WordCacheEncoder(tokenizer)
    assert not encoder.usable
    flat, lengths = encoder.encode(["Hola Mundo", "Y la tierra"])
    assert np.split(flat, np.cumsum(lengths)[:-1])[1].tolist() == tokenizer("Y la tierra")["input_ids"]


def test_worker_processes_give_the_same_prepared_pairs(corpus_dir, tokenizer_dir, tmp_path):
    from attention_seq2seq.data.prepared import encode_training_pairs, iter_text_batches

    train = load_corpus(spec(corpus_dir))["train"]
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    one = encode_training_pairs(iter_text_batches(train, 300), tokenizer, tmp_path / "one", MAX_LEN, MAX_LEN)
    two = encode_training_pairs(
        iter_text_batches(train, 300),
        tokenizer,
        tmp_path / "two",
        MAX_LEN,
        MAX_LEN,
        num_proc=2,
        tokenizer_file=tokenizer_dir / "tokenizer.json",
    )
    assert (one.read, one.kept) == (two.read, two.kept) == (1500, one.kept) and one.filtered > 0
    for name in ("source_tokens.bin", "target_tokens.bin", "source_offsets.npy", "target_offsets.npy", "kept.npy"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def test_runs_share_the_cache_and_no_cache_keeps_it_in_the_run(corpus_dir, tmp_path, monkeypatch, caplog):
    """Two runs with different output folders: the second reads the first's entry (same
    tokenizer, no preparation); a resumed run finds the entry through its model/ tokenizer copy;
    --no_cache prepares into the run folder."""
    import logging

    from attention_seq2seq.training.build import load_data
    from attention_seq2seq.training.config import config_from_dict
    from attention_seq2seq.training.train_config import TrainConfig

    monkeypatch.setenv("ATTENTION_SEQ2SEQ_CACHE", str(tmp_path / "cache"))
    accelerator = __import__("accelerate").Accelerator(cpu=True)

    def config(out, **kw):
        return config_from_dict(
            TrainConfig,
            dict(
                corpus=spec(corpus_dir),
                vocab_size=500,
                max_source_length=MAX_LEN,
                max_target_length=MAX_LEN,
                output_dir=str(out),
                **kw,
            ),
        )

    calls = []
    real = prep.encode_training_pairs
    monkeypatch.setattr(prep, "encode_training_pairs", lambda *a, **k: calls.append(1) or real(*a, **k))
    with caplog.at_level(logging.INFO, logger="attention_seq2seq.training"):
        first, _, tok_a = load_data(config(tmp_path / "a"), accelerator, tmp_path / "a")
        second, _, tok_b = load_data(config(tmp_path / "b"), accelerator, tmp_path / "b")
        again, _, _ = load_data(config(tmp_path / "a"), accelerator, tmp_path / "a")  # model/ exists: a resume
    assert len(calls) == 1
    assert "prepared corpus built in" in caplog.text and "prepared corpus read from" in caplog.text
    assert first["train"].folder == second["train"].folder == again["train"].folder
    assert str(tmp_path / "cache" / "corpora") in str(first["train"].folder)
    assert tok_a.get_vocab() == tok_b.get_vocab()
    assert (tmp_path / "a" / "model" / "tokenizer.json").read_bytes() == (
        tmp_path / "b" / "model" / "tokenizer.json"
    ).read_bytes()

    own, _, _ = load_data(config(tmp_path / "c", no_cache=True), accelerator, tmp_path / "c")
    assert own["train"].folder.is_relative_to(tmp_path / "c" / "corpus_cache") and len(calls) == 2
    assert own["train"].column("source") == first["train"].column("source")


def test_prepared_pairs_pickle_as_their_folder(tmp_path):
    """DataLoader workers get the folder, not a copy of the token arrays."""
    import pickle

    write_pairs(tmp_path, [([[1] * 5000, [2, 3]], [[4, 5], [6] * 5000])])
    pairs = PreparedPairs(tmp_path)
    blob = pickle.dumps(pairs)
    assert len(blob) < 500
    back = pickle.loads(blob)
    assert [back[i] for i in range(2)] == [pairs[i] for i in range(2)]


@pytest.mark.parametrize("seed", range(6))
def test_sorted_cut_gives_the_example_by_example_batches(seed):
    """TokenBudgetBatchSampler._cut_sorted (one batch at a time) equals _cut (one example at a
    time) on sorted orders: random lengths, budgets, caps, single pairs over the budget."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 90, size=(int(rng.integers(1, 3000)), 2))
    sampler = TokenBudgetBatchSampler(
        lengths, max_tokens=int(rng.integers(40, 2000)), seed=seed, max_batch_size=[None, 7][seed % 2]
    )
    order = np.lexsort((rng.permutation(len(lengths)), lengths.min(axis=1), sampler.size))
    assert sampler._cut_sorted(order) == sampler._cut(order)


def test_tokenizer_train_pairs_below_1_is_refused():
    from attention_seq2seq.training.config import RecipeError
    from attention_seq2seq.training.train_config import TrainConfig, validate_config

    with pytest.raises(RecipeError, match=r"tokenizer_train_pairs must be >= 1 or null \(all training pairs\); got 0"):
        validate_config(TrainConfig(max_steps=1, tokenizer_train_pairs=0))
    validate_config(TrainConfig(max_steps=1, tokenizer_train_pairs=None))


def _prepare_in_process(args):
    folder, tokenizer_dir, root = args
    result = prepare_corpus(
        spec(folder), tokenizer_path=str(tokenizer_dir), max_source_length=MAX_LEN, max_target_length=MAX_LEN, root=root
    )
    return result.built, str(result.folder), len(result.train)


def test_two_processes_build_one_entry_and_map_the_same_files(corpus_dir, tokenizer_dir, tmp_path):
    """What the ranks of a run (or two runs started together) do: one builds under the lock, the
    other waits and reads the same folder."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        results = pool.map(_prepare_in_process, [(corpus_dir, tokenizer_dir, tmp_path)] * 2)
    assert sorted(built for built, _, _ in results) == [False, True]
    assert len({folder for _, folder, _ in results}) == 1 and len({n for _, _, n in results}) == 1
