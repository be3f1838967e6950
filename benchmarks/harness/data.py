"""The benchmarks' data: Multi30k read in place, one cached tokenizer for every side and
subprocess, and identical batches (token-budget batches independent of the package's data layer,
so the work is fixed across versions of the package)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from harness.machine import REPO_ROOT


def multi30k_dir() -> Path:
    env = os.environ.get("ATTN_SEQ2SEQ_SHARED_DATA")
    root = Path(env) if env else REPO_ROOT.parent / "shared" / "data"
    return root / "multi30k"


def read_pairs(split: str = "train", limit: int | None = None) -> list[tuple[str, str]]:
    """(German source, English target) pairs of a Multi30k split, read in place (never copied)."""
    root = multi30k_dir()
    with open(root / f"{split}.de", encoding="utf-8") as f_de, open(root / f"{split}.en", encoding="utf-8") as f_en:
        pairs = [(de.rstrip("\n"), en.rstrip("\n")) for de, en in zip(f_de, f_en)]
    return pairs[:limit] if limit else pairs


def test2016_translation_setup(dims) -> tuple:
    """Benchmark 3's inputs: (tokenizer, test2016 sources, new tokens per sentence), where the number
    of new tokens is the mean test2016 reference length in pieces, rounded up (each side decodes
    exactly that many, with no `</s>`)."""
    import math

    tokenizer = build_tokenizer(dims.vocab_size)
    pairs = read_pairs("test2016")
    ref_lengths = [len(ids) for ids in tokenizer([t for _, t in pairs])["input_ids"]]
    return tokenizer, [s for s, _ in pairs], math.ceil(sum(ref_lengths) / len(ref_lengths))


def build_tokenizer(vocab_size: int = 8000, cache_dir: Path | None = None):
    """A joint de+en tokenizer trained on Multi30k train, with the package's special-token ids.

    Uses the data layer's `train_tokenizer` when it is importable; otherwise trains a unigram model
    with `tokenizers` directly (pad 0, <s> 1, </s> 2, unk 3; `</s>` appended to every sequence).
    Either way the result is a `PreTrainedTokenizerFast`, cached on disk so every subprocess and
    both sides of a benchmark see exactly the same vocabulary.
    """
    from transformers import PreTrainedTokenizerFast

    # BENCH_TOKENIZER_PAIRS=N trains on the first N pairs only (scripts/gpu_check.sh --dry-run: a
    # rehearsal whose figures mean nothing need not spend a minute on the full corpus).
    limit = int(os.environ.get("BENCH_TOKENIZER_PAIRS", 0)) or None
    name = f"tok{vocab_size}" + (f"_first{limit}" if limit else "")
    cache_dir = cache_dir or Path(os.environ.get("BENCH_CACHE", "/tmp/attention_seq2seq_bench")) / name
    if (cache_dir / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(cache_dir))
    pairs = read_pairs("train", limit)
    tokenizer = None
    try:
        from attention_seq2seq.data import train_tokenizer  # the data layer, when present
        import datasets

        train = datasets.Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
        dataset = datasets.DatasetDict({"train": train})
        try:
            tokenizer = train_tokenizer(dataset, vocab_size=vocab_size, model_type="unigram")
        except Exception:  # noqa: BLE001 - the signature may want the split itself
            tokenizer = train_tokenizer(train, vocab_size=vocab_size, model_type="unigram")
        tokenizer.init_kwargs["bench_source"] = "attention_seq2seq.data.train_tokenizer"
    except ImportError:
        tokenizer = _train_unigram_directly(pairs, vocab_size)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(cache_dir))
    return PreTrainedTokenizerFast.from_pretrained(str(cache_dir))


def _train_unigram_directly(pairs, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator((text for pair in pairs for text in pair), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def tokenize_pairs(tokenizer, pairs) -> tuple[list[list[int]], list[list[int]]]:
    src = tokenizer([s for s, _ in pairs], add_special_tokens=True)["input_ids"]
    tgt = tokenizer([t for _, t in pairs], add_special_tokens=True)["input_ids"]
    return src, tgt


# ----------------------------------------------------------------------------------------------
# Identical batches
# ----------------------------------------------------------------------------------------------


def token_budget_batches(src_ids, tgt_ids, max_tokens: int, seed: int = 0) -> list[list[int]]:
    """Indices of length-bucketed batches whose padded size max(src, tgt) x batch <= max_tokens.

    Independent of the data layer so the batches (and therefore the work) are fixed across
    versions of the package; the pipeline benchmark uses the data layer's own sampler instead.
    """
    order = sorted(range(len(src_ids)), key=lambda i: (len(tgt_ids[i]), len(src_ids[i]), i))
    batches, current, longest = [], [], 0
    for i in order:
        length = max(len(src_ids[i]), len(tgt_ids[i]))
        if current and max(longest, length) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, length)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def collate(src_ids, tgt_ids, indices, pad_id: int = 0, decoder_start_id: int = 1) -> dict:
    """Right-padded `input_ids`, `attention_mask`, `labels` (-100 on padding), `decoder_input_ids`."""
    import torch

    srcs = [src_ids[i] for i in indices]
    tgts = [tgt_ids[i] for i in indices]
    s_len, t_len = max(map(len, srcs)), max(map(len, tgts))
    input_ids = torch.full((len(srcs), s_len), pad_id, dtype=torch.long)
    labels = torch.full((len(tgts), t_len), -100, dtype=torch.long)
    for row, (s, t) in enumerate(zip(srcs, tgts)):
        input_ids[row, : len(s)] = torch.tensor(s)
        labels[row, : len(t)] = torch.tensor(t)
    decoder_input_ids = torch.full_like(labels, pad_id)
    decoder_input_ids[:, 0] = decoder_start_id
    shifted = labels[:, :-1]
    decoder_input_ids[:, 1:] = shifted.masked_fill(shifted == -100, pad_id)  # shift right, -100 -> pad
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != pad_id).long(),
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": (decoder_input_ids != pad_id).long().index_fill_(1, torch.tensor([0]), 1),
        "labels": labels,
    }


def batch_stats(batch: dict) -> dict:
    labels = batch["labels"]
    return {
        "batch_size": int(labels.shape[0]),
        "src_len": int(batch["input_ids"].shape[1]),
        "tgt_len": int(labels.shape[1]),
        "tgt_tokens": int((labels != -100).sum()),
        "src_tokens": int(batch["attention_mask"].sum()),
        "tgt_padded": int(labels.numel()),
        "src_padded": int(batch["input_ids"].numel()),
    }


def load_batches(max_tokens: int, count: int, vocab_size: int = 8000, seed: int = 0, split: str = "train"):
    """`count` identical-for-both-sides training batches of at most `max_tokens` padded tokens."""
    tokenizer = build_tokenizer(vocab_size)
    pairs = read_pairs(split)
    src, tgt = tokenize_pairs(tokenizer, pairs)
    indices = token_budget_batches(src, tgt, max_tokens, seed)
    # Keep full-size batches only (the tail of a length bucket can be tiny).
    sizes = sorted(len(b) * max(max(len(src[i]), len(tgt[i])) for i in b) for b in indices)
    floor = sizes[len(sizes) // 4]
    chosen = [b for b in indices if len(b) * max(max(len(src[i]), len(tgt[i])) for i in b) >= floor][:count]
    return tokenizer, [collate(src, tgt, b) for b in chosen]
