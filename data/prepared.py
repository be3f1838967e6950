"""Prepared corpora: tokenized training pairs as memory-mapped flat arrays, and the on-disk cache
that lets a second run (another output folder, another rank) start training in seconds.

Layout of one prepared training split (a folder)::

    source_tokens.bin   int32, every pair's source ids one after another (</s> included)
    source_offsets.npy  int64 (num_pairs + 1,): pair i's ids are tokens[offsets[i]:offsets[i + 1]]
    target_tokens.bin   int32, the same for the labels
    target_offsets.npy  int64 (num_pairs + 1,)

This is fairseq's binarized dataset idea (``MMapIndexedDataset``) reduced to what the trainer
needs: the token-budget sampler reads only the lengths (``np.diff`` of the offsets, a few bytes a
pair), and :class:`PreparedPairs` reads the ids of a batch's rows when the loader asks for them.
Nothing holds every pair as Python objects: the operating system pages the files in and out,
and every rank of a multi-process run maps the same files.

The cache (:func:`prepare_corpus`) lives in ``$ATTENTION_SEQ2SEQ_CACHE/corpora`` (default
``~/.cache/attention_seq2seq/corpora``, as ``training/precision.py``)::

    corpora/<corpus key>/tokenizer/              the tokenizer trained on this corpus (or copied)
    corpora/<corpus key>/prepared-<data key>/    train/ (arrays above), validation/, test/
                                                 (datasets.save_to_disk), info.json, meta.json

The corpus key hashes the corpus spec, the filters, the training-pair limit, the size and
modification time of every file the spec names, and the tokenizer settings; the data key hashes
the tokenizer file actually used and the length limits. A changed file or option therefore
builds a new entry; an unchanged one is reused. Entries are built in a temporary folder and
renamed into place under a file lock, so concurrent runs and ranks neither corrupt nor duplicate
them. Each entry carries a ``MANIFEST.json`` (every file's size and SHA-256), checked before the
entry is used: a truncated, bit-flipped or incomplete entry is rebuilt with one warning.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..common.durability import check_manifest, exclusive, file_sha256, write_atomically, write_manifest

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the layout or the preparation changes what is stored
TOKEN_DTYPE = np.int32
SIDES = ("source", "target")
ENCODE_CHUNK = 20_000  # pairs per tokenizing step (and per task of a worker process)
PARALLEL_PAIRS = 200_000  # from this many training pairs on, worker processes tokenize (they take seconds to start)


# --------------------------------------------------------------------------------------------
# The memory-mapped pairs
# --------------------------------------------------------------------------------------------


class PreparedPairs(torch.utils.data.Dataset):
    """Tokenized pairs read from a prepared folder (memory-mapped; see the module docstring).

    Item ``i`` is ``{"input_ids": [...], "labels": [...], "id": i}``, as
    :class:`~.pairs.PairDataset` gives it, so the same ``Collate`` builds the batches.

    Args:
        folder: a folder written by :func:`write_pairs`.

    Raises:
        FileNotFoundError: a file of the layout is missing.
        ValueError: offsets that do not fit the token files (a truncated or foreign folder).
    """

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self._tokens, self._offsets = {}, {}
        for side in SIDES:
            offsets = np.load(self.folder / f"{side}_offsets.npy", mmap_mode="r")
            path = self.folder / f"{side}_tokens.bin"
            size = path.stat().st_size // np.dtype(TOKEN_DTYPE).itemsize
            if offsets.ndim != 1 or len(offsets) < 1 or int(offsets[-1]) != size:
                raise ValueError(f"{self.folder}: {side}_offsets.npy does not fit {path.name} ({size} tokens)")
            # np.memmap refuses an empty file; an empty side has no rows to read anyway
            self._tokens[side] = np.memmap(path, dtype=TOKEN_DTYPE, mode="r") if size else np.zeros(0, TOKEN_DTYPE)
            self._offsets[side] = offsets
        if len(self._offsets["source"]) != len(self._offsets["target"]):
            raise ValueError(f"{self.folder}: source and target hold different numbers of pairs")

    def __getstate__(self) -> dict:
        # DataLoader workers receive the folder and map the files themselves (a memmap would pickle as a full copy)
        return {"folder": str(self.folder)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"])

    def __len__(self) -> int:
        return len(self._offsets["source"]) - 1

    def row(self, side: str, i: int) -> np.ndarray:
        """Pair ``i``'s token ids on ``side`` (``"source"`` or ``"target"``), a read-only view."""
        offsets = self._offsets[side]
        return self._tokens[side][int(offsets[i]) : int(offsets[i + 1])]

    def __getitem__(self, i: int) -> dict:
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} out of range for {len(self)} pairs")
        i = int(i) % len(self)
        return {"input_ids": self.row("source", i).tolist(), "labels": self.row("target", i).tolist(), "id": i}

    def lengths(self) -> np.ndarray:
        """(num_pairs, 2) int64: source and target length of each pair, in tokens (ids untouched)."""
        return np.stack([np.diff(np.asarray(self._offsets[side], dtype=np.int64)) for side in SIDES], axis=1)

    def kept_indices(self) -> np.ndarray | None:
        """Indices into the cleaned training split of the pairs held here (None if not recorded)."""
        path = self.folder / "kept.npy"
        return np.load(path) if path.exists() else None

    def column(self, side: str) -> list[list[int]]:
        """Every pair's ids on one side as Python lists (for subword resampling, which rewrites them)."""
        tokens, offsets = np.asarray(self._tokens[side]), np.asarray(self._offsets[side])
        return [tokens[a:b].tolist() for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]


class _SideWriter:
    """Appends rows of ids to ``<side>_tokens.bin`` and remembers their offsets."""

    def __init__(self, folder: Path, side: str):
        self.folder, self.side = folder, side
        self.file = open(folder / f"{side}_tokens.bin", "wb")
        self.lengths: list[np.ndarray] = []

    def add(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(flat, dtype=TOKEN_DTYPE).tobytes())
        self.lengths.append(np.asarray(lengths, dtype=np.int64))

    def close(self) -> None:
        self.file.close()
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        np.save(self.folder / f"{self.side}_offsets.npy", offsets)


def write_pairs(
    folder: str | os.PathLike, rows: Iterable[tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]]
) -> int:
    """Write chunks of ``(source rows, target rows)`` (lists of id lists) as a prepared folder.

    Returns the number of pairs written. The folder is created if needed.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    writers = {side: _SideWriter(folder, side) for side in SIDES}
    n = 0
    for source_rows, target_rows in rows:
        for side, side_rows in zip(SIDES, (source_rows, target_rows)):
            lengths = np.fromiter(map(len, side_rows), dtype=np.int64, count=len(side_rows))
            flat = np.fromiter(itertools.chain.from_iterable(side_rows), dtype=TOKEN_DTYPE, count=int(lengths.sum()))
            writers[side].add(flat, lengths)
        n += len(source_rows)
    for writer in writers.values():
        writer.close()
    return n


# --------------------------------------------------------------------------------------------
# Tokenizing the training split
# --------------------------------------------------------------------------------------------


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text with the special tokens (``</s>`` last), in one batched call of the
    fast tokenizer's Rust backend (its own threads; ``TOKENIZERS_PARALLELISM`` / ``RAYON_NUM_THREADS``
    bound them). The same ids as ``tokenizer(texts)["input_ids"]``."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=True)]


class WordCacheEncoder:
    """Tokenizes cleaned text word by word through a cache of each word's pieces, into flat arrays.

    The tokenizers trained here (data/tokenization.py) have no normalizer and a ``Metaspace``
    pre-tokenizer (``prepend_scheme="always"``, ``split=True``): a text is cut at its spaces and
    each word is segmented on its own, so a text's ids are its words' ids one after another
    between the post-processor's prefix and suffix (``</s>``). Words repeat (Zipf), so after the
    first chunks almost every word is a dictionary look-up; the ids are the backend's own, new
    words going through one ``encode_batch`` call. Texts must be cleaned as ``load_corpus``
    cleans them (single spaces, no leading or trailing space).

    ``usable`` is False for any other pipeline (a normalizer, another pre-tokenizer, BPE dropout);
    :meth:`encode` then falls back to ``encode_batch``. The first texts encoded are also checked
    against ``encode_batch``; a difference switches the fallback on for good.

    Args:
        tokenizer: a ``PreTrainedTokenizerFast`` or a ``tokenizers.Tokenizer``.
        max_words: the cache is emptied when it holds more words than this (bounded memory).
    """

    def __init__(self, tokenizer, max_words: int = 2_000_000, verify: int = 2000):
        self.backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        self.cache: dict[str, list[int]] = {}
        self.max_words, self.to_verify = max_words, verify
        self.usable = self._pipeline_fits()
        if self.usable:
            plain = self.backend.encode("x", add_special_tokens=False).ids
            full = self.backend.encode("x", add_special_tokens=True).ids
            at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None)
            if at is None:
                self.usable = False
            else:
                self.prefix, self.suffix = full[:at], full[at + len(plain) :]

    def _pipeline_fits(self) -> bool:
        try:
            state = json.loads(self.backend.to_str())
        except Exception:  # noqa: BLE001  (a backend that cannot serialize: use encode_batch)
            return False
        pre = state.get("pre_tokenizer") or {}
        model = state.get("model") or {}
        return (
            state.get("normalizer") is None
            and pre.get("type") == "Metaspace"
            and pre.get("split", True) is True
            and pre.get("prepend_scheme", "always") == "always"
            and pre.get("replacement", "▁") == "▁"
            and model.get("type") in ("Unigram", "BPE", "WordPiece", "WordLevel")
            and not model.get("dropout")
        )

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(flat ids int32, lengths int64 (len(texts),))`` of the texts, special tokens included."""
        if not texts:
            return np.zeros(0, TOKEN_DTYPE), np.zeros(0, np.int64)
        if not self.usable:
            return _flatten(encode_texts(self.backend, texts))
        flat, lengths = self._encode_words(texts)
        if self.to_verify > 0:
            k = min(self.to_verify, len(texts))
            ref_flat, ref_lengths = _flatten(encode_texts(self.backend, texts[:k]))
            if not (
                np.array_equal(ref_lengths, lengths[:k]) and np.array_equal(ref_flat, flat[: int(ref_lengths.sum())])
            ):
                logger.warning("word-cache tokenization differs from the tokenizer's on this text: using encode_batch")
                self.usable = False
                return _flatten(encode_texts(self.backend, texts))
            self.to_verify -= k
        return flat, lengths

    def _encode_words(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        words = " ".join(texts).split(" ")
        words_per_text = np.fromiter((t.count(" ") + 1 for t in texts), dtype=np.int64, count=len(texts))
        if len(self.cache) > self.max_words:
            self.cache.clear()
        cache = self.cache
        new = [w for w in set(words) if w not in cache]
        if new:
            for word, encoding in zip(new, self.backend.encode_batch(new, add_special_tokens=False)):
                cache[word] = encoding.ids
        pieces = list(map(cache.__getitem__, words))
        piece_counts = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        body = np.fromiter(itertools.chain.from_iterable(pieces), dtype=TOKEN_DTYPE, count=int(piece_counts.sum()))
        word_starts = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(words_per_text[:-1], out=word_starts[1:])
        body_lengths = np.add.reduceat(piece_counts, word_starts) if len(pieces) else np.zeros(len(texts), np.int64)
        p, q = len(self.prefix), len(self.suffix)
        lengths = body_lengths + p + q
        out = np.empty(int(lengths.sum()), dtype=TOKEN_DTYPE)
        out_starts = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(lengths[:-1], out=out_starts[1:])
        body_starts = np.zeros(len(texts), dtype=np.int64)
        np.cumsum(body_lengths[:-1], out=body_starts[1:])
        # token j of the body goes to out_start + p + (j - body_start) of its text
        shift = np.repeat(out_starts + p - body_starts, body_lengths)
        out[np.arange(len(body)) + shift] = body
        for k, token in enumerate(self.prefix):
            out[out_starts + k] = token
        for k, token in enumerate(self.suffix):
            out[out_starts + p + body_lengths + k] = token
        return out, lengths


def _flatten(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=TOKEN_DTYPE, count=int(lengths.sum())), lengths


@dataclass
class EncodeStats:
    """What :func:`encode_training_pairs` did: pairs read, kept and dropped as over a length limit."""

    read: int = 0
    kept: int = 0
    filtered: int = 0
    seconds: float = 0.0  # wall clock
    cpu_seconds: float = 0.0  # CPU time of this process and the workers (load-independent)


_WORKER: dict = {}


def _worker_init(tokenizer_file: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    from tokenizers import Tokenizer

    _WORKER["encoder"] = WordCacheEncoder(Tokenizer.from_file(tokenizer_file))


def _worker_encode(batch: Mapping[str, list[str]]) -> tuple:
    start = time.process_time()
    encoder = _WORKER["encoder"]
    return encoder.encode(batch["source"]) + encoder.encode(batch["target"]) + (time.process_time() - start,)


def _encoded_chunks(batches: Iterable[Mapping[str, list[str]]], tokenizer, num_proc: int, tokenizer_file: str | None):
    """``(source flat, source lengths, target flat, target lengths)`` per chunk, in order; with
    ``num_proc > 1`` (and the tokenizer's file) computed by that many worker processes, at most
    ``2 * num_proc`` chunks in flight (bounded memory)."""
    if num_proc <= 1 or tokenizer_file is None:
        encoder = WordCacheEncoder(tokenizer)
        for batch in batches:
            yield encoder.encode(batch["source"]) + encoder.encode(batch["target"]) + (0.0,)
        return
    import collections
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # fork on Linux (as datasets.map's num_proc): a spawned worker would import torch and datasets
    # again (~0.4 GB each); the tokenizers library turns its thread pool off in a forked child.
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(
        num_proc, mp_context=context, initializer=_worker_init, initargs=(tokenizer_file,)
    ) as pool:
        pending: collections.deque = collections.deque()
        for batch in batches:
            pending.append(pool.submit(_worker_encode, {"source": batch["source"], "target": batch["target"]}))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def encode_training_pairs(
    batches: Iterable[Mapping[str, list[str]]],
    tokenizer,
    folder: str | os.PathLike,
    max_source_length: int,
    max_target_length: int,
    *,
    num_proc: int = 1,
    tokenizer_file: str | os.PathLike | None = None,
) -> EncodeStats:
    """Tokenize chunks of ``{"source": [...], "target": [...]}`` into a prepared folder, dropping
    pairs with a side over its limit (``</s>`` counted), as ``tokenize_dataset(..., overlong="filter")``
    does for the training split; the kept pairs keep their order. Also writes ``kept.npy``, the
    indices of the kept pairs among those read.

    Args:
        num_proc: worker processes (each with its own :class:`WordCacheEncoder`); 1: this process.
        tokenizer_file: the tokenizer's ``tokenizer.json``, which the workers load (needed for ``num_proc > 1``).

    Raises:
        ValueError: a limit below 2 (a piece and ``</s>``).
    """
    if min(max_source_length, max_target_length) < 2:
        raise ValueError(
            f"max lengths must be at least 2 (a piece and </s>); got {max_source_length}, {max_target_length}"
        )
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    stats = EncodeStats()
    start = time.perf_counter()
    writers = {side: _SideWriter(folder, side) for side in SIDES}
    kept_indices = []
    cpu_start = time.process_time()
    for src_flat, src_len, tgt_flat, tgt_len, worker_cpu in _encoded_chunks(
        batches, tokenizer, num_proc, str(tokenizer_file) if tokenizer_file else None
    ):
        stats.cpu_seconds += worker_cpu
        keep = (src_len <= max_source_length) & (tgt_len <= max_target_length)
        kept_indices.append(stats.read + np.flatnonzero(keep))
        stats.read += len(src_len)
        for side, flat, lengths in (("source", src_flat, src_len), ("target", tgt_flat, tgt_len)):
            if not keep.all():
                flat, lengths = flat[np.repeat(keep, lengths)], lengths[keep]
            writers[side].add(flat, lengths)
    for writer in writers.values():
        writer.close()
    # which pairs of the cleaned training split were kept (subword resampling reads their texts)
    np.save(folder / "kept.npy", np.concatenate(kept_indices) if kept_indices else np.zeros(0, np.int64))
    stats.kept = int(sum(len(k) for k in kept_indices))
    stats.filtered = stats.read - stats.kept
    stats.seconds = time.perf_counter() - start
    stats.cpu_seconds += time.process_time() - cpu_start
    return stats


def iter_text_batches(dataset, batch_size: int = ENCODE_CHUNK) -> Iterable[dict[str, list[str]]]:
    """Chunks of ``{"source", "target"}`` strings from a ``datasets.Dataset`` (Arrow, no full copy)."""
    for start in range(0, len(dataset), batch_size):
        chunk = dataset[start : start + batch_size]
        yield {"source": chunk["source"], "target": chunk["target"]}


def tokenizer_sample(num_pairs: int, limit: int | None, seed: int = 0) -> np.ndarray | None:
    """Sorted indices of at most ``limit`` training pairs for tokenizer training, drawn with
    ``numpy.random.default_rng(seed)`` (SentencePiece's ``input_sentence_size``); None: use all."""
    if limit is None or num_pairs <= limit:
        return None
    if limit < 1:
        raise ValueError(f"tokenizer_train_pairs must be positive; got {limit}")
    return np.sort(np.random.default_rng(seed).choice(num_pairs, size=limit, replace=False))


# --------------------------------------------------------------------------------------------
# The cache
# --------------------------------------------------------------------------------------------


def cache_root() -> Path:
    """``$ATTENTION_SEQ2SEQ_CACHE/corpora``, else ``$XDG_CACHE_HOME`` or ``~/.cache`` +
    ``attention_seq2seq/corpora``."""
    root = os.environ.get("ATTENTION_SEQ2SEQ_CACHE")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attention_seq2seq"
    return Path(root) / "corpora"


def files_fingerprint(location: str | None) -> list[list]:
    """``[relative path, size, mtime_ns]`` of every file a corpus location names: the files of a
    folder (recursively), one file, or the files ``<prefix>.*`` of a file prefix; [] when the
    location is not a local path (a 🤗 dataset id, the Bible's module names)."""
    if not location:
        return []
    root = Path(location).expanduser()
    if root.is_dir():
        paths = sorted(p for p in root.rglob("*") if p.is_file())
    elif root.is_file():
        paths = [root]
    else:
        paths = sorted(p for p in root.parent.glob(f"{root.name}.*") if p.is_file()) if root.parent.is_dir() else []
    out = []
    for path in paths:
        st = path.stat()
        out.append([str(path.relative_to(root) if root.is_dir() else path.name), st.st_size, st.st_mtime_ns])
    return out


def digest(payload: Any) -> str:
    """A short stable hash of a JSON-able value (sorted keys)."""
    text = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def build_once(final: Path, build: Callable[[Path], None]) -> bool:
    """Make sure ``final`` exists and is whole: under a lock beside it, check the entry's manifest
    (:func:`~attention_seq2seq.common.durability.check_manifest`: every file's size and SHA-256);
    build it when it is missing or damaged (one warning saying what was wrong), write its
    manifest, and put it in place whole (:func:`~attention_seq2seq.common.durability.write_atomically`).
    No reader ever sees a half-built entry, concurrent processes build it once, and a builder
    killed at any moment leaves only a temporary folder, which the next builder removes. Returns
    True if this call built it.

    Raises:
        DiskFullError: the disk filled while building (one line naming the entry and the space
            free there; nothing is left in the cache).
    """

    def build_checked(tmp: Path) -> None:
        tmp.mkdir()
        build(tmp)
        write_manifest(tmp)

    with exclusive(str(final) + ".lock", f"the corpus cache entry {final}", wait=True):
        if final.exists():
            problem = check_manifest(final)
            if problem is None:
                return False
            logger.warning("corpus cache entry %s is damaged (%s): building it again", final, problem)
        write_atomically(
            final, build_checked, what="the corpus cache entry", kept="nothing half-built is left in the cache"
        )
    return True


@dataclass
class PreparedCorpus:
    """A prepared corpus: the folder it lives in, the training pairs (memory-mapped), the
    tokenized validation/test splits (``datasets``, memory-mapped Arrow), the corpus info and the
    tokenizer folder."""

    folder: Path
    train: PreparedPairs
    splits: Any  # datasets.DatasetDict: validation, test (source, target, input_ids, labels, lengths)
    info: Any  # CorpusInfo
    tokenizer_dir: Path
    built: bool  # this call built the data (False: read from the cache)
    meta: dict


def prepare_corpus(
    corpus,
    *,
    filters: Mapping[str, Any] | None = None,
    max_train_pairs: int | None = None,
    tokenizer_type: str = "unigram",
    vocab_size: int = 8000,
    tokenizer_path: str | None = None,
    tokenizer_train_pairs: int | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    max_source_length: int = 256,
    max_target_length: int = 256,
    root: str | os.PathLike | None = None,
    num_proc: int | None = None,
) -> PreparedCorpus:
    """Load, tokenize and store a corpus once; later calls with the same inputs read it back.

    Args:
        corpus: a corpus spec (``load_corpus``'s).
        filters: ``CorpusFilters`` fields (train split only).
        max_train_pairs: keep only the first N training pairs (after cleaning).
        tokenizer_type, vocab_size: the tokenizer trained on the corpus when no other is given.
        tokenizer_path: a saved tokenizer folder to use instead of training one.
        tokenizer_train_pairs: train the tokenizer on at most this many training pairs, a sample
            drawn with seed 0 (None: all of them).
        tokenizer_dir: a tokenizer folder that must be used as it is (a resumed run's
            ``model/``); its file's hash is part of the data key.
        max_source_length, max_target_length: training pairs over either limit are dropped;
            validation and test sides are truncated.
        root: the cache folder (default :func:`cache_root`); a run with ``--no_cache`` passes a
            folder of its own.
        num_proc: tokenizing processes; None: one per core (at most 8) from
            :data:`PARALLEL_PAIRS` training pairs on, else this process alone.

    Raises:
        CorpusError: from ``load_corpus`` (bad spec, malformed row, ...).
        ValueError: a length limit below 2 or a non-positive ``tokenizer_train_pairs``.
    """
    from .spec import CorpusSpec

    spec = CorpusSpec.coerce(corpus)
    root = Path(root) if root is not None else cache_root()
    tokenizer_files = files_fingerprint(tokenizer_path) if tokenizer_path else []
    corpus_key = digest(
        {
            "version": FORMAT_VERSION,
            "spec": str(spec),
            "filters": dict(filters or {}),
            "max_train_pairs": max_train_pairs,
            "files": files_fingerprint(spec.location),
            "tokenizer": [tokenizer_type, vocab_size, tokenizer_path, tokenizer_files, tokenizer_train_pairs],
        }
    )
    entry = root / corpus_key
    raw_cache: dict = {}

    def raw():
        if not raw_cache:
            from .corpora import load_corpus

            start, cpu = time.perf_counter(), time.process_time()
            data, info = load_corpus(spec, filters=filters or None, return_info=True)
            if max_train_pairs is not None:
                data["train"] = data["train"].select(range(min(max_train_pairs, len(data["train"]))))
            logger.info(
                "read and cleaned %s: %s pairs in %.1f s (%.1f CPU-s)",
                spec,
                {split: len(ds) for split, ds in data.items()},
                time.perf_counter() - start,
                time.process_time() - cpu,
            )
            raw_cache.update(data=data, info=info)
        return raw_cache["data"], raw_cache["info"]

    def build_tokenizer(tmp: Path) -> None:
        from transformers import PreTrainedTokenizerFast

        if tokenizer_path:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_path)
        else:
            from .tokenization import train_tokenizer

            train = raw()[0]["train"]
            sample = tokenizer_sample(len(train), tokenizer_train_pairs)
            if sample is not None:
                train = train.select(sample)
            start, cpu = time.perf_counter(), time.process_time()
            tokenizer = train_tokenizer(train, vocab_size, model_type=tokenizer_type)
            logger.info(
                "trained a %s tokenizer (%d pieces) on %d of %d training pairs in %.1f s (%.1f CPU-s)",
                tokenizer_type,
                len(tokenizer),
                len(train),
                len(raw()[0]["train"]),
                time.perf_counter() - start,
                time.process_time() - cpu,
            )
        tokenizer.save_pretrained(tmp)

    if tokenizer_dir is None or not (Path(tokenizer_dir) / "tokenizer.json").exists():
        build_once(entry / "tokenizer", build_tokenizer)
        tokenizer_dir = entry / "tokenizer"
    tokenizer_dir = Path(tokenizer_dir)
    data_key = digest(
        {
            "tokenizer": file_sha256(tokenizer_dir / "tokenizer.json")[:20],
            "lengths": [max_source_length, max_target_length],
        }
    )
    folder = entry / f"prepared-{data_key}"

    def build_data(tmp: Path) -> None:
        from transformers import PreTrainedTokenizerFast

        from .batching import tokenize_dataset

        data, info = raw()
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
        workers = (
            num_proc
            if num_proc is not None
            else (min(8, os.cpu_count() or 1) if len(data["train"]) >= PARALLEL_PAIRS else 1)
        )
        stats = encode_training_pairs(
            iter_text_batches(data["train"]),
            tokenizer,
            tmp / "train",
            max_source_length,
            max_target_length,
            num_proc=workers,
            tokenizer_file=tokenizer_dir / "tokenizer.json",
        )
        logger.info(
            "tokenized %d training pairs in %.1f s (%.0f pairs/s; %.1f CPU-s in %d process(es)); %d kept, "
            "%d over %d/%d tokens dropped",
            stats.read,
            stats.seconds,
            stats.read / max(stats.seconds, 1e-9),
            stats.cpu_seconds,
            workers,
            stats.kept,
            stats.filtered,
            max_source_length,
            max_target_length,
        )
        import datasets

        rest = datasets.DatasetDict({s: data[s] for s in data if s != "train"})
        rest = tokenize_dataset(rest, tokenizer, max_source_length, max_target_length, overlong="filter")
        rest.save_to_disk(str(tmp / "splits"))
        (tmp / "info.json").write_text(json.dumps(info.to_dict(), indent=1))
        meta = {
            "spec": str(spec),
            "corpus_key": corpus_key,
            "data_key": data_key,
            "train_pairs_read": stats.read,
            "train_pairs": stats.kept,
            "train_pairs_dropped": stats.filtered,
            "tokenize_seconds": stats.seconds,
            "max_source_length": max_source_length,
            "max_target_length": max_target_length,
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))

    built = build_once(folder, build_data)
    return open_prepared(folder, tokenizer_dir, built)


def open_prepared(folder: Path, tokenizer_dir: Path, built: bool = False) -> PreparedCorpus:
    """Open a prepared folder written by :func:`prepare_corpus` (memory-mapped, nothing copied)."""
    import datasets

    from .spec import CorpusInfo

    info = CorpusInfo(**json.loads((folder / "info.json").read_text()))
    splits = datasets.load_from_disk(str(folder / "splits"))
    meta = json.loads((folder / "meta.json").read_text())
    return PreparedCorpus(folder, PreparedPairs(folder / "train"), splits, info, tokenizer_dir, built, meta)
