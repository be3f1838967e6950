"""Data for translation: parallel corpora, subword tokenizers and token-budget batches.

- :func:`load_corpus` / :class:`CorpusSpec` / :class:`CorpusFilters` (``corpora.py``): a spec
  string such as ``bible``, ``multi30k:<dir>`` or ``tsv:<dir>:zh-en`` to a ``DatasetDict``.
- :func:`train_tokenizer` (``tokenization.py``): Unigram/BPE tokenizers with ``<pad>``=0,
  ``<s>``=1, ``</s>``=2, ``<unk>``=3, saved as ``PreTrainedTokenizerFast``; :class:`SubwordSampler`,
  sampled segmentations for subword regularization.
- :func:`tokenize_dataset`, :class:`TokenBudgetBatchSampler`, :class:`Seq2SeqCollator`,
  :func:`padding_fraction` (``batching.py``).
- The Bible corpus (``bible.py``) is read from installed SWORD modules through ``load_corpus("bible")``.
"""

from .batching import (
    IGNORE_INDEX,
    Seq2SeqCollator,
    TokenBudgetBatchSampler,
    batch_lengths,
    epoch_padding_fraction,
    padding_fraction,
    tokenize_dataset,
)
from .corpora import CorpusError, CorpusFilters, CorpusInfo, CorpusSpec, load_corpus
from .tokenization import SeparateTokenizers, SubwordSampler, train_tokenizer

__all__ = [
    "IGNORE_INDEX",
    "CorpusError",
    "CorpusFilters",
    "CorpusInfo",
    "CorpusSpec",
    "Seq2SeqCollator",
    "SeparateTokenizers",
    "SubwordSampler",
    "TokenBudgetBatchSampler",
    "batch_lengths",
    "epoch_padding_fraction",
    "load_corpus",
    "padding_fraction",
    "tokenize_dataset",
    "train_tokenizer",
]
