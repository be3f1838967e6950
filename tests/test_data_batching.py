"""Tests for attention_seq2seq.data.batching: tokenize_dataset, the token-budget sampler, the collator.

Everything runs on a 3,000-pair slice of Multi30k with a small tokenizer trained on it.
"""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from helpers import pairs_corpus_spec
from transformers import DataCollatorForSeq2Seq

from attention_seq2seq.data import (
    Seq2SeqCollator,
    TokenBudgetBatchSampler,
    batch_lengths,
    load_corpus,
    tokenize_dataset,
    train_tokenizer,
)
from attention_seq2seq.data.tokenization import EOS_ID, PAD_ID


pytestmark = pytest.mark.usefixtures("quiet_datasets")  # fixture in conftest.py


@pytest.fixture(scope="module")
def corpus() -> datasets.DatasetDict:
    """Up to 3,000 / 200 / 200 pairs of Multi30k (../shared/data), else of the committed Bible pairs."""
    full = load_corpus(pairs_corpus_spec())
    sizes = {"train": 3000, "validation": 200, "test": 200}
    return datasets.DatasetDict(
        {split: full[split].select(range(min(n, len(full[split])))) for split, n in sizes.items()}
    )


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer(corpus, vocab_size=2000)


@pytest.fixture(scope="module")
def tokenized(corpus, tokenizer) -> datasets.DatasetDict:
    return tokenize_dataset(corpus, tokenizer, max_source_length=64, max_target_length=64)


@pytest.fixture(scope="module")
def lengths(tokenized) -> np.ndarray:
    return batch_lengths(tokenized["train"])


# --------------------------------------------------------------------------------------------
# tokenize_dataset
# --------------------------------------------------------------------------------------------


def test_tokenize_dataset_columns(tokenized, tokenizer, corpus):
    train = tokenized["train"]
    assert set(train.column_names) == {"source", "target", "input_ids", "labels", "source_length", "target_length"}
    row = train[5]
    assert row["input_ids"] == tokenizer(corpus["train"][5]["source"])["input_ids"]
    assert row["labels"] == tokenizer(text_target=corpus["train"][5]["target"])["input_ids"]
    assert row["input_ids"][-1] == EOS_ID and row["labels"][-1] == EOS_ID
    assert (row["source_length"], row["target_length"]) == (len(row["input_ids"]), len(row["labels"]))
    assert batch_lengths(train).shape == (len(corpus["train"]), 2)


@pytest.mark.parametrize("overlong", ["truncate", "filter"])
def test_overlong_pairs_truncated_or_filtered_with_counts(corpus, tokenizer, overlong):
    full = tokenize_dataset(corpus, tokenizer, 512, 512)
    too_long = {s: sum(max(a, b) > 12 for a, b in batch_lengths(d)) for s, d in full.items()}
    assert too_long["train"] > 100
    out, stats = tokenize_dataset(corpus, tokenizer, 12, 12, overlong=overlong, return_stats=True)
    pairs = {split: len(dataset) for split, dataset in corpus.items()}
    if overlong == "truncate":
        assert stats["train"] == {"pairs": pairs["train"], "truncated": too_long["train"], "filtered": 0}
        assert max(len(ids) for ids in out["train"]["input_ids"]) == 12
    else:
        kept = pairs["train"] - too_long["train"]
        assert stats["train"] == {"pairs": kept, "truncated": 0, "filtered": too_long["train"]}
        assert len(out["train"]) == kept
    # Evaluation splits are never filtered: every sentence is kept, cut to the limit.
    assert stats["validation"] == {"pairs": pairs["validation"], "truncated": too_long["validation"], "filtered": 0}
    assert all(ids[-1] == EOS_ID and len(ids) <= 12 for ids in out["validation"]["labels"])


# --------------------------------------------------------------------------------------------
# TokenBudgetBatchSampler
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [256, 1024, 4096])
def test_every_example_once_within_budget(lengths, max_tokens):
    sampler = TokenBudgetBatchSampler(lengths, max_tokens, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    widths = [lengths[b].max() * len(b) for b in batches]  # padded max(src, tgt) x batch
    assert max(widths) <= max_tokens
    assert np.mean(widths) > 0.8 * max_tokens  # and the budget is actually used


def test_single_pair_over_budget_gets_its_own_batch():
    sampler = TokenBudgetBatchSampler([[5, 5], [40, 3], [6, 6], [5, 4]], max_tokens=20, shuffle=False)
    assert [1] in list(sampler)


def test_deterministic_per_seed_and_epoch(lengths):
    a = TokenBudgetBatchSampler(lengths, 1024, seed=7)
    b = TokenBudgetBatchSampler(lengths, 1024, seed=7)
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b)
    b.set_epoch(4)
    assert list(a) != list(b)
    assert list(TokenBudgetBatchSampler(lengths, 1024, seed=8)) != list(TokenBudgetBatchSampler(lengths, 1024, seed=7))
    # Epochs draw different batches, not only a different order of the same batches.
    a.set_epoch(0)
    b.set_epoch(1)
    assert {tuple(sorted(x)) for x in a} != {tuple(sorted(x)) for x in b}


def test_no_shuffle_is_sorted_by_length(lengths):
    batches = list(TokenBudgetBatchSampler(lengths, 1024, shuffle=False))
    widths = [lengths[b].max() for b in batches]
    assert widths == sorted(widths)


@pytest.mark.parametrize("world", [2, 3, 4, 7])
def test_rank_shards_are_disjoint_and_equal(lengths, world):
    shards = [list(TokenBudgetBatchSampler(lengths, 1024, seed=2, num_replicas=world, rank=r)) for r in range(world)]
    assert len({len(s) for s in shards}) == 1, [len(s) for s in shards]  # DDP: same number of steps
    seen = [i for shard in shards for batch in shard for i in batch]
    assert len(seen) == len(set(seen)) == len(lengths)  # disjoint, and together the whole epoch
    assert len(TokenBudgetBatchSampler(lengths, 1024, seed=2, num_replicas=world, rank=0)) == len(shards[0])


def test_uneven_batch_count_is_evened_by_splitting(lengths):
    single = TokenBudgetBatchSampler(lengths, 1024, seed=0)
    world = len(single) + 1  # never a multiple: batches must be split
    shards = [list(TokenBudgetBatchSampler(lengths, 1024, seed=0, num_replicas=world, rank=r)) for r in range(world)]
    assert all(len(s) == 1 for s in shards)
    assert sum(len(b) for s in shards for b in s) == len(lengths)


def test_resume_mid_epoch(lengths):
    sampler = TokenBudgetBatchSampler(lengths, 1024, seed=5, num_replicas=2, rank=1)
    sampler.set_epoch(2)
    full = list(sampler)
    sampler.set_epoch(2, start_batch=10)
    assert len(sampler) == len(full) - 10
    assert list(sampler) == full[10:]
    assert list(sampler) == full  # the offset applies to one pass only
    sampler.set_epoch(2, start_batch=3)
    assert list(sampler) == full[3:]


def test_new_lengths_give_the_batches_of_a_sampler_built_with_them(lengths):
    longer = lengths + np.random.default_rng(0).integers(0, 4, size=lengths.shape)  # e.g. sampled subwords
    sampler = TokenBudgetBatchSampler(lengths, 1024, seed=3, num_replicas=2, rank=1)
    sampler.set_epoch(1)
    before = list(sampler)
    sampler.set_lengths(longer)
    after = list(sampler)
    assert after != before
    fresh = TokenBudgetBatchSampler(longer, 1024, seed=3, num_replicas=2, rank=1)
    fresh.set_epoch(1)
    assert after == list(fresh) and len(sampler) == len(fresh)
    with pytest.raises(ValueError, match=r"lengths must keep the shape"):
        sampler.set_lengths(longer[:-1])


def test_bad_sampler_arguments():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\); got 2"):
        TokenBudgetBatchSampler([3, 4, 5], 100, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="2 examples cannot fill 3 ranks x 1 micro-batches"):
        TokenBudgetBatchSampler([3, 4], 100, num_replicas=3, rank=0)
    with pytest.raises(ValueError, match="accumulation must be >= 1; got 0"):
        TokenBudgetBatchSampler([3, 4], 100, accumulation=0)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        TokenBudgetBatchSampler([3, 4], 0)


def _padding_waste(lengths: np.ndarray, batches: list[list[int]]) -> float:
    """The padded share of an epoch's source and target tensors, each padded to its batch's longest row."""
    real = sum(int(lengths[batch].sum()) for batch in batches)
    padded = sum(int(lengths[batch].max(axis=0).sum()) * len(batch) for batch in batches)
    return 1.0 - real / padded


def test_bucketing_wastes_less_padding_than_random_batches(lengths):
    sampler = TokenBudgetBatchSampler(lengths, 2048, seed=0)
    bucketed = sampler.global_batches()
    # Random batches of the same sizes: the padding a plain shuffled DataLoader would waste.
    order = np.random.default_rng(0).permutation(len(lengths))
    cuts = np.cumsum([len(b) for b in bucketed])[:-1]
    random_batches = [part.tolist() for part in np.split(order, cuts)]
    bucketed_waste, random_waste = _padding_waste(lengths, bucketed), _padding_waste(lengths, random_batches)
    print(f"\npadding fraction, max_tokens=2048: bucketed {bucketed_waste:.3f}, random {random_waste:.3f}")
    assert bucketed_waste < 0.5 * random_waste


# --------------------------------------------------------------------------------------------
# Collator
# --------------------------------------------------------------------------------------------


def test_collator_matches_data_collator_for_seq2seq(tokenized, tokenizer, lengths):
    reference = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=-100, return_tensors="pt")
    ours = Seq2SeqCollator(pad_token_id=tokenizer.pad_token_id)
    for batch in list(TokenBudgetBatchSampler(lengths, 512, seed=0))[:5]:
        features = [tokenized["train"][i] for i in batch]
        expected = reference([{k: f[k] for k in ("input_ids", "labels")} for f in features])
        got = ours(features)
        assert set(got) == {"input_ids", "attention_mask", "labels"}
        for key in got:
            assert got[key].dtype == torch.long
            assert torch.equal(got[key], expected[key]), key


def test_collator_masks_and_pads():
    features = [{"input_ids": [5, 6, 2], "labels": [7, 2]}, {"input_ids": [2], "labels": [8, 9, 10, 2]}]
    batch = Seq2SeqCollator(pad_to_multiple_of=4)(features)
    assert batch["input_ids"].tolist() == [[5, 6, 2, PAD_ID], [2, PAD_ID, PAD_ID, PAD_ID]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]
    assert batch["labels"].tolist() == [[7, 2, -100, -100], [8, 9, 10, 2]]


def test_dataloader_end_to_end(tokenized, lengths):
    sampler = TokenBudgetBatchSampler(lengths, 1024, seed=0, num_replicas=2, rank=0)
    loader = torch.utils.data.DataLoader(tokenized["train"], batch_sampler=sampler, collate_fn=Seq2SeqCollator())
    batches = list(loader)
    assert len(batches) == len(sampler)
    for batch, indices in zip(batches, sampler):
        assert batch["attention_mask"].sum(dim=1).tolist() == [int(lengths[i, 0]) for i in indices]
        assert (batch["labels"] != -100).sum(dim=1).tolist() == [int(lengths[i, 1]) for i in indices]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_see_the_batches_of_one_process_accumulating_as_many_micro_batches(lengths, world):
    # One process accumulating `world` micro-batches per update must draw the ranks' batches in
    # the same order, also where the plain batch count is not a multiple of `world` (before, the
    # ranks split a batch to even it out and the single process did not).
    uneven = 0
    for max_tokens in (400, 500, 600, 700, 900, 1024, 1300, 1500):
        uneven += len(TokenBudgetBatchSampler(lengths, max_tokens).global_batches()) % world != 0
        one = TokenBudgetBatchSampler(lengths, max_tokens, seed=max_tokens, accumulation=world)
        ranks = [
            TokenBudgetBatchSampler(lengths, max_tokens, seed=max_tokens, num_replicas=world, rank=r)
            for r in range(world)
        ]
        single = list(one)
        assert one.global_batches() == ranks[0].global_batches() and len(single) % world == 0
        for r, sampler in enumerate(ranks):
            assert list(sampler) == single[r::world]
    assert uneven  # the case that used to differ is among these
