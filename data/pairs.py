"""The training loop's side of the data: tokenized pairs in memory, collation with
``decoder_input_ids``, the resumable stream of micro-batches and the evaluation batches.

``batching.py`` holds the generic pieces (token-budget sampler, padding collator); this module
holds what the trainer (``training/train.py``) builds from them. Nothing here imports a model.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch

from ..modeling.losses import shift_tokens_right
from .batching import Seq2SeqCollator


class PairDataset(torch.utils.data.Dataset):
    """Tokenized pairs held as Python lists (no Arrow row access per example in the hot loop).

    Args:
        input_ids: one list of source token ids per pair.
        labels: one list of target token ids per pair.

    Item ``i`` is ``{"input_ids": [...], "labels": [...], "id": i}``.
    """

    def __init__(self, input_ids: list[list[int]], labels: list[list[int]]):
        self.input_ids, self.labels = input_ids, labels

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.input_ids[i], "labels": self.labels[i], "id": i}

    def lengths(self) -> np.ndarray:
        """(num_pairs, 2): source and target length of each pair, in tokens."""
        return np.array([[len(s), len(t)] for s, t in zip(self.input_ids, self.labels)], dtype=np.int64).reshape(-1, 2)


class Collate:
    """The data layer's padding plus what the loop needs: ``decoder_input_ids`` (labels shifted
    right behind ``decoder_start_token_id``, so the model does not compute its own loss) and
    ``id`` (batch,), the dataset indices of the examples.

    Returns ``input_ids``/``attention_mask`` (batch, src_len), ``labels``/``decoder_input_ids``
    (batch, tgt_len), labels -100 on padding.
    """

    def __init__(self, pad_token_id: int, decoder_start_token_id: int):
        self.pad, self.start = pad_token_id, decoder_start_token_id
        self.collator = Seq2SeqCollator(pad_token_id=pad_token_id)

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        batch = self.collator(features)
        batch["decoder_input_ids"] = shift_tokens_right(batch["labels"], self.pad, self.start)
        batch["id"] = torch.tensor([f["id"] for f in features])
        return batch


def micro_batches(loader, sampler, position, device, before_epoch=None) -> Iterator[dict]:
    """Endless stream of this rank's micro-batches, epoch after epoch, on ``device``.

    Args:
        loader: a ``DataLoader`` over a :class:`PairDataset` whose ``batch_sampler`` is ``sampler``.
        sampler: a :class:`~.batching.TokenBudgetBatchSampler` (``set_epoch(epoch, start_batch=...)``).
        position: an object with integer attributes ``epoch`` and ``batch_in_epoch`` (the
            trainer's ``TrainerState``), advanced here as batches are consumed.
        device: where the tensors go (``id`` stays on the CPU).
        before_epoch: ``before_epoch(epoch)``, if given, runs before each epoch's batches are
            drawn (subword resampling).

    ``position.epoch`` / ``position.batch_in_epoch`` count what was consumed (not what a loader
    worker prefetched), so a checkpoint records the exact position to resume from; the sampler
    skips the consumed batches as index lists, never collating them.
    """
    while True:
        if before_epoch is not None:
            before_epoch(position.epoch)
        sampler.set_epoch(position.epoch, start_batch=position.batch_in_epoch)
        for batch in loader:
            position.batch_in_epoch += 1
            yield {k: v if k == "id" else v.to(device, non_blocking=True) for k, v in batch.items()}
        position.epoch += 1
        position.batch_in_epoch = 0


def eval_batches(
    input_ids: Sequence[list[int]],
    labels: Sequence[list[int]],
    collate: Collate,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    device="cpu",
) -> Iterator[tuple[list[int], dict]]:
    """This rank's share of length-sorted evaluation batches.

    Args:
        input_ids, labels: the tokenized pairs to evaluate (all of them; cut a prefix beforehand).
        collate: builds each batch (:class:`Collate`).
        batch_size: sentences per batch.
        rank, world_size: batches ``rank, rank + world_size, ...`` of the sorted list are this rank's.
        device: where the batch tensors go.

    Yields:
        ``(example indices, batch)``: the indices into ``input_ids`` and the collated batch on ``device``.
    """
    n = len(input_ids)
    order = sorted(range(n), key=lambda i: len(input_ids[i]))
    chunks = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    for chunk in chunks[rank::world_size]:
        batch = collate([{"input_ids": input_ids[i], "labels": labels[i], "id": i} for i in chunk])
        yield chunk, {k: v.to(device) for k, v in batch.items()}
