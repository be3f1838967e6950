"""Token-budget batches: tokenizing a corpus, length-bucketed batch sampling, padding.

The pieces, in the order a training script uses them::

    tokenized = tokenize_dataset(corpus, tokenizer, max_source_length=256, max_target_length=256)
    train = tokenized["train"]
    sampler = TokenBudgetBatchSampler(
        batch_lengths(train), max_tokens=4096, shuffle=True, seed=0,
        num_replicas=accelerator.num_processes, rank=accelerator.process_index,
    )
    loader = DataLoader(train, batch_sampler=sampler, collate_fn=Seq2SeqCollator(pad_token_id=0))
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader: ...

Token budget
    A batch's cost is its *padded* size, ``len(batch) * max(max source length, max target
    length)`` in tokens, as fairseq's ``max_tokens`` counts it: the larger of the two padded
    tensors, which is what bounds activation memory. Every batch costs at most ``max_tokens``,
    except that a single pair longer than the budget forms a batch of its own.

Distributed runs
    The sampler shards the batches itself, so hand the ``DataLoader`` to the training loop
    without letting ``accelerator.prepare`` shard it again (or pass ``num_replicas=1`` and let
    Accelerate shard). Every rank sees a disjoint set of examples and the same number of
    batches, which DDP needs (a rank with one step more would hang the all-reduce).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import datasets
import numpy as np
import torch
from torch.utils.data import Sampler
from transformers import PreTrainedTokenizerBase

from .tokenization import PAD_ID, SeparateTokenizers

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100  # label padding: the loss ignores it
LENGTH_COLUMNS = ("source_length", "target_length")


# --------------------------------------------------------------------------------------------
# Tokenizing a corpus
# --------------------------------------------------------------------------------------------


def tokenize_dataset(
    dataset: datasets.DatasetDict | datasets.Dataset,
    tokenizer: PreTrainedTokenizerBase | SeparateTokenizers,
    max_source_length: int,
    max_target_length: int,
    *,
    overlong: Literal["truncate", "filter"] = "truncate",
    overlong_splits: Sequence[str] = ("train",),
    num_proc: int | None = None,
    return_stats: bool = False,
) -> datasets.DatasetDict | datasets.Dataset | tuple[Any, dict[str, dict[str, int]]]:
    """Tokenize ``source``/``target`` into ``input_ids``/``labels`` with batched ``datasets.map``.

    Adds the columns ``input_ids`` (source pieces + ``</s>``), ``labels`` (target pieces +
    ``</s>``), ``source_length`` and ``target_length`` (their lengths in tokens, for
    :func:`batch_lengths`) and keeps ``source``/``target`` (references for BLEU).

    Args:
        dataset: a ``DatasetDict`` (every split is tokenized) or one ``Dataset``.
        tokenizer: one tokenizer for both sides, or a :class:`SeparateTokenizers` pair.
        max_source_length / max_target_length: most tokens per side, ``</s>`` included.
        overlong: in the splits named by ``overlong_splits``, ``"truncate"`` cuts a long side
            to the limit (keeping ``</s>`` last) and ``"filter"`` drops the pair. Other splits
            are always truncated, never filtered, so evaluation sets keep every sentence.
        overlong_splits: the splits ``overlong`` applies to (a single ``Dataset`` counts as ``train``).
        num_proc: worker processes for ``map``.
        return_stats: also return ``{split: {"pairs", "truncated", "filtered"}}``.

    Raises:
        ValueError: unknown ``overlong``, lengths below 2, or missing ``source``/``target`` columns.
    """
    if overlong not in ("truncate", "filter"):
        raise ValueError(f"overlong must be one of 'truncate', 'filter'; got {overlong!r}")
    if min(max_source_length, max_target_length) < 2:
        raise ValueError(
            f"max lengths must be at least 2 (a piece and </s>); got {max_source_length}, {max_target_length}"
        )
    src_tok, tgt_tok = tokenizer if isinstance(tokenizer, SeparateTokenizers) else (tokenizer, tokenizer)

    def encode(batch: dict[str, list[str]]) -> dict[str, list]:
        # Untruncated first, to count what is over the limit; the cut keeps </s> last.
        source = src_tok(batch["source"], add_special_tokens=True)["input_ids"]
        target = tgt_tok(text_target=batch["target"], add_special_tokens=True)["input_ids"]
        return {
            "input_ids": [_cut(ids, max_source_length) for ids in source],
            "labels": [_cut(ids, max_target_length) for ids in target],
            "source_length": [min(len(ids), max_source_length) for ids in source],
            "target_length": [min(len(ids), max_target_length) for ids in target],
            "overlong": [len(s) > max_source_length or len(t) > max_target_length for s, t in zip(source, target)],
        }

    def one(split: str, ds: datasets.Dataset) -> tuple[datasets.Dataset, dict[str, int]]:
        missing = {"source", "target"} - set(ds.column_names)
        if missing:
            raise ValueError(f"split {split!r} lacks column(s) {sorted(missing)}; columns: {ds.column_names}")
        ds = ds.map(encode, batched=True, num_proc=num_proc, desc=f"tokenize {split}")
        n_over = int(sum(ds["overlong"]))
        stats = {"pairs": len(ds), "truncated": n_over, "filtered": 0}
        if overlong == "filter" and split in overlong_splits and n_over:
            ds = ds.filter(lambda flags: [not f for f in flags], input_columns="overlong", batched=True)
            stats = {"pairs": len(ds), "truncated": 0, "filtered": n_over}
        if n_over:
            logger.info(
                "%s: %d pairs over %d/%d tokens %s",
                split,
                n_over,
                max_source_length,
                max_target_length,
                "dropped" if stats["filtered"] else "truncated",
            )
        return ds.remove_columns("overlong"), stats

    if isinstance(dataset, datasets.Dataset):
        out, stats = one("train", dataset)
        all_stats = {"train": stats}
    else:
        results = {split: one(split, ds) for split, ds in dataset.items()}
        out = datasets.DatasetDict({split: ds for split, (ds, _) in results.items()})
        all_stats = {split: stats for split, (_, stats) in results.items()}
    return (out, all_stats) if return_stats else out


def _cut(ids: list[int], limit: int) -> list[int]:
    return ids if len(ids) <= limit else ids[: limit - 1] + [ids[-1]]


def batch_lengths(dataset: datasets.Dataset) -> np.ndarray:
    """``(num_examples, 2)`` int array of (source, target) token counts from a tokenized split."""
    if not set(LENGTH_COLUMNS) <= set(dataset.column_names):
        raise ValueError(f"dataset lacks {LENGTH_COLUMNS}; tokenize it with tokenize_dataset first")
    return np.stack([np.asarray(dataset[c], dtype=np.int64) for c in LENGTH_COLUMNS], axis=1)


# --------------------------------------------------------------------------------------------
# The sampler
# --------------------------------------------------------------------------------------------


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches of dataset indices under a padded-token budget.

    Each epoch: the examples are ordered by length (longest side, then the other side) with
    ties broken at random, cut greedily into batches whose padded cost
    ``len(batch) * max(src_len, tgt_len)`` stays within ``max_tokens``, and the batch order is
    shuffled. Everything is drawn from ``numpy.random.default_rng((seed, epoch))``, so a
    (seed, epoch) gives the same batches on every rank and every run.

    Sharding: the batch count is made a multiple of ``num_replicas * accumulation`` by splitting
    the batches with most examples in two (every example is still used exactly once), and rank
    ``r`` takes batches ``r, r + num_replicas, ...``. Ranks get disjoint examples and equally many
    batches, and the global batch list depends only on the product: two ranks see the batches
    that one process accumulating two micro-batches per update sees, in the same order.

    Resuming: ``set_epoch(epoch, start_batch=k)`` makes the next iteration
    start at this rank's ``k``-th batch of that epoch; ``len()`` then counts what is left.

    Args:
        lengths: per example, its length in tokens (ints) or (source, target) lengths, shape
            ``(num_examples,)`` or ``(num_examples, 2)``; see :func:`batch_lengths`.
        max_tokens: padded-token budget per batch.
        shuffle: randomize ties and batch order; ``False`` gives batches sorted by length.
        seed: random seed, combined with the epoch.
        num_replicas / rank: data-parallel world size and this process's rank.
        max_batch_size: optional cap on examples per batch.
        accumulation: micro-batches per optimizer update on each rank (gradient accumulation).

    Raises:
        ValueError: empty ``lengths``, non-positive ``max_tokens``, a rank outside
            ``[0, num_replicas)``, or fewer examples than ranks.
    """

    def __init__(
        self,
        lengths: Sequence[int] | Sequence[Sequence[int]] | np.ndarray,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        max_batch_size: int | None = None,
        accumulation: int = 1,
    ) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim == 1:
            lengths = lengths[:, None]
        if lengths.ndim != 2 or len(lengths) == 0:
            raise ValueError(
                f"lengths must be a non-empty (num_examples,) or (num_examples, 2) array; got shape {lengths.shape}"
            )
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive; got {max_tokens}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}); got {rank}")
        if accumulation < 1:
            raise ValueError(f"accumulation must be >= 1; got {accumulation}")
        if len(lengths) < num_replicas * accumulation:
            raise ValueError(f"{len(lengths)} examples cannot fill {num_replicas} ranks x {accumulation} micro-batches")
        self.lengths = lengths
        self.size = lengths.max(axis=1)  # the padded width an example forces on its batch
        self.max_tokens = max_tokens
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.max_batch_size = max_batch_size
        self.accumulation = accumulation
        self.epoch = 0
        self.start_batch = 0
        self._last: tuple[int, list[list[int]]] | None = None  # (epoch, its global batches)

    def set_lengths(self, lengths: Sequence[int] | Sequence[Sequence[int]] | np.ndarray) -> None:
        """Replace the examples' lengths (a new segmentation of the same examples, e.g. subword
        sampling); takes effect at the next iteration.

        Raises:
            ValueError: a different number of examples or shape than before.
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim == 1:
            lengths = lengths[:, None]
        if lengths.shape != self.lengths.shape:
            raise ValueError(f"lengths must keep the shape {self.lengths.shape}; got {lengths.shape}")
        self.lengths = lengths
        self.size = lengths.max(axis=1)
        self._last = None

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch to draw; ``start_batch`` skips this rank's first batches (resume)."""
        self.epoch = epoch
        self.start_batch = start_batch

    def global_batches(self, epoch: int | None = None) -> list[list[int]]:
        """All ranks' batches of an epoch, in order (rank ``r`` takes every ``num_replicas``-th).

        The last epoch's list is kept (``len()`` and the iteration that follows draw it once, seconds
        on millions of pairs); treat it as read-only."""
        epoch = self.epoch if epoch is None else epoch
        if self._last is not None and self._last[0] == epoch:
            return self._last[1]
        batches = self._draw(epoch)
        self._last = (epoch, batches)
        return batches

    def _draw(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng((self.seed, epoch))
        n = len(self.size)
        tie_break = rng.permutation(n) if self.shuffle else np.arange(n)
        # lexsort's last key is the primary one: longest side, then the other side, then chance.
        order = np.lexsort((tie_break, self.lengths.min(axis=1), self.size))
        batches = self._cut_sorted(order)
        while len(batches) % (self.num_replicas * self.accumulation):
            widest = max(range(len(batches)), key=lambda i: (len(batches[i]), -i))
            half = len(batches[widest]) // 2
            if half == 0:  # cannot happen while there are at least num_replicas examples
                raise RuntimeError("cannot split batches evenly among ranks and micro-batches")
            batch = batches[widest]
            batches[widest : widest + 1] = [batch[:half], batch[half:]]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _cut_sorted(self, order: np.ndarray) -> list[list[int]]:
        """:meth:`_cut` for an order of non-decreasing width (what :meth:`global_batches` sorts):
        the same batches, found a batch at a time on a short window instead of an example at a
        time (millions of pairs: about a second instead of tens).

        With widths sorted, a batch starting at ``s`` holds the examples ``s + m`` for which
        ``width[s + m] * (m + 1) <= max_tokens`` (a non-decreasing product, so a prefix), at least
        one, at most ``max_batch_size``; ``m + 1 <= max_tokens // width[s]`` bounds the window."""
        size = self.size[order]
        n = len(order)
        cap = self.max_batch_size or n
        ends = []
        start = 0
        while start < n:
            window = min(n - start, cap, max(1, self.max_tokens // max(1, int(size[start]))))
            cost = size[start : start + window] * np.arange(1, window + 1)
            start += max(1, int(np.count_nonzero(cost <= self.max_tokens)))
            ends.append(start)
        return [part.tolist() for part in np.split(order, ends[:-1])]

    def _cut(self, order: np.ndarray) -> list[list[int]]:
        batches, current, width = [], [], 0
        cap = self.max_batch_size or math.inf
        for index in order.tolist():
            new_width = max(width, int(self.size[index]))
            if current and (new_width * (len(current) + 1) > self.max_tokens or len(current) >= cap):
                batches.append(current)
                current, new_width = [], int(self.size[index])
            current.append(index)
            width = new_width
        if current:
            batches.append(current)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        mine = self.global_batches()[self.rank :: self.num_replicas]
        start, self.start_batch = self.start_batch, 0  # a resume offset applies to one iteration
        yield from mine[start:]

    def __len__(self) -> int:
        return max(0, len(self.global_batches()) // self.num_replicas - self.start_batch)


# --------------------------------------------------------------------------------------------
# Collating
# --------------------------------------------------------------------------------------------


class Seq2SeqCollator:
    """Pad tokenized examples into a batch, as ``DataCollatorForSeq2Seq`` (without a model) does.

    Returns ``input_ids`` (batch, src_len) padded with ``pad_token_id``, ``attention_mask``
    (batch, src_len) with 1 on tokens and 0 on padding, and ``labels`` (batch, tgt_len) padded
    with -100; all ``torch.long``, right-padded. ``decoder_input_ids`` are left to the model
    (``shift_tokens_right(labels)``). Other columns (text, lengths) are ignored.

    Args:
        pad_token_id: the tokenizer's pad id (0 for the tokenizers trained here).
        pad_to_multiple_of: round padded lengths up to a multiple (tensor-core friendly).
    """

    def __init__(self, pad_token_id: int = PAD_ID, pad_to_multiple_of: int | None = None) -> None:
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        input_ids = self._pad([f["input_ids"] for f in features], self.pad_token_id)
        # The mask comes from the lengths, not from comparing ids with pad_token_id.
        source_lengths = torch.tensor([len(f["input_ids"]) for f in features])
        attention_mask = (torch.arange(input_ids.shape[1])[None, :] < source_lengths[:, None]).long()
        batch = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "labels" in features[0]:
            batch["labels"] = self._pad([f["labels"] for f in features], IGNORE_INDEX)
        return batch

    def _pad(self, rows: list[Sequence[int]], value: int) -> torch.Tensor:
        width = max(len(r) for r in rows)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        out = torch.full((len(rows), width), value, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        return out
