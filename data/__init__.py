"""Data for translation: parallel corpora, subword tokenizers and token-budget batches.

- :func:`load_corpus` / :class:`CorpusSpec` / :class:`CorpusFilters` (``corpora.py``): a spec
  string such as ``bible``, ``multi30k:<dir>`` or ``tsv:<dir>:zh-en`` to a ``DatasetDict``.
- :func:`train_tokenizer` (``tokenization.py``): Unigram/BPE tokenizers with ``<pad>``=0,
  ``<s>``=1, ``</s>``=2, ``<unk>``=3, saved as ``PreTrainedTokenizerFast``; :class:`SubwordSampler`,
  sampled segmentations for subword regularization.
- :func:`tokenize_dataset`, :class:`TokenBudgetBatchSampler`, :class:`Seq2SeqCollator`
  (``batching.py``).
- The Bible corpus (``bible.py``) is read from installed SWORD modules through ``load_corpus("bible")``.
- Named corpora and their terms (``presets.py``), the spec types (``spec.py``), and the trainer's
  batches (``pairs.py``).

Names load on first use: importing the package (or ``presets``) imports neither torch nor datasets.
"""

from attention_seq2seq.common.errors import lazy_exports

# Public name -> the submodule that defines it, imported on first access (PEP 562): reading the
# corpus presets (the model card does) imports neither torch nor datasets.
_EXPORTS = {
    **dict.fromkeys(
        (
            "IGNORE_INDEX",
            "Seq2SeqCollator",
            "TokenBudgetBatchSampler",
            "batch_lengths",
            "tokenize_dataset",
        ),
        ".batching",
    ),
    **dict.fromkeys(("CorpusFilters", "load_corpus"), ".corpora"),
    **dict.fromkeys(("CorpusError", "CorpusInfo", "CorpusSpec"), ".spec"),
    **dict.fromkeys(("SeparateTokenizers", "SubwordSampler", "train_tokenizer"), ".tokenization"),
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
