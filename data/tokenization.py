"""Subword tokenizers for translation, trained with 🤗 `tokenizers` and saved as transformers tokenizers.

What every tokenizer trained here looks like:

- Special tokens at fixed ids (docs/DESIGN.md): ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2, ``<unk>`` = 3.
- A post-processor appends ``</s>`` to every sequence, source and target alike
  (``input_ids = pieces + [</s>]``, ``labels = pieces + [</s>]``); no ``<s>`` in front.
- SentencePiece-style segmentation: no normalizer, no language-specific pre-tokenizer. The
  ``Metaspace`` pre-tokenizer only turns spaces into ``▁``, so a language written without
  spaces (Chinese) is segmented by the subword model alone, with no pre-segmentation.
- Byte fallback: a character never seen in training is spelled as UTF-8 byte pieces
  ``<0x00>`` … ``<0xFF>`` instead of ``<unk>``, so ``decode(encode(text)) == text`` holds for any
  text whose spaces are single (runs of spaces and leading/trailing spaces are not kept).
  Decoding therefore gives back normal, detokenized text, the text BLEU is computed on.

The result is a ``transformers.PreTrainedTokenizerFast``: ``save_pretrained(folder)`` writes it,
``AutoTokenizer.from_pretrained(folder)`` loads it, and ``tokenizer(src, text_target=tgt)``
returns ``input_ids``, ``attention_mask`` and ``labels``.

Joint or separate vocabularies
    ``joint=True`` (the default) trains one vocabulary on source and target text together; one
    tokenizer serves both sides, and the models can tie encoder, decoder and output embeddings.
    ``joint=False`` trains one vocabulary per side and returns a :class:`SeparateTokenizers`
    pair ``(source, target)``. Both use the same special-token ids, so padding and EOS handling
    are unchanged; the encoder embedding needs ``len(pair.source)`` rows, the decoder and
    output layer ``len(pair.target)`` rows, and embeddings cannot be shared between encoder and
    decoder. :func:`attention_seq2seq.data.batching.tokenize_dataset` accepts either form.
    Save a pair with ``pair.save_pretrained(folder)`` (``folder/source``, ``folder/target``)
    and load it with :meth:`SeparateTokenizers.from_pretrained`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import datasets
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)  # ids 0, 1, 2, 3
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
BYTE_PIECES = tuple(f"<0x{b:02X}>" for b in range(256))
MODEL_TYPES = ("unigram", "bpe")

TextSource = datasets.Dataset | datasets.DatasetDict | Iterable[tuple[str, str]]


@dataclass(frozen=True)
class SeparateTokenizers:
    """A source tokenizer and a target tokenizer with separate vocabularies (``joint=False``).

    Both carry the special tokens at ids 0-3. Encode source text with ``source`` and target
    text with ``target``; decode model outputs with ``target``.
    """

    source: PreTrainedTokenizerFast
    target: PreTrainedTokenizerFast

    def __iter__(self) -> Iterator[PreTrainedTokenizerFast]:
        return iter((self.source, self.target))

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """Write the two tokenizers to ``folder/source`` and ``folder/target``."""
        self.source.save_pretrained(os.path.join(folder, "source"))
        self.target.save_pretrained(os.path.join(folder, "target"))

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> SeparateTokenizers:
        """Load a pair written by :meth:`save_pretrained`."""
        return cls(
            AutoTokenizer.from_pretrained(os.path.join(folder, "source")),
            AutoTokenizer.from_pretrained(os.path.join(folder, "target")),
        )


def train_tokenizer(
    dataset: TextSource,
    vocab_size: int,
    model_type: Literal["unigram", "bpe"] = "unigram",
    joint: bool = True,
    *,
    max_piece_length: int = 16,
    model_max_length: int = 1024,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast | SeparateTokenizers:
    """Train a subword tokenizer on parallel text.

    Args:
        dataset: the training text: a ``datasets.Dataset`` with string columns ``source`` and
            ``target``, a ``DatasetDict`` (its ``train`` split is used, never validation or test),
            or an iterable of ``(source, target)`` pairs.
        vocab_size: size of each vocabulary, counting the 4 special tokens and the 256 byte
            pieces; at least 300. Unigram may stop a little short of it on a small corpus.
        model_type: ``"unigram"`` (SentencePiece unigram language model, the default) or ``"bpe"``.
        joint: one vocabulary for both sides (default) or one per side (see module docstring).
        max_piece_length: longest piece, in characters.
        model_max_length: the ``model_max_length`` recorded in the saved tokenizer.
        show_progress: show the `tokenizers` progress bars.

    Returns:
        A ``PreTrainedTokenizerFast`` if ``joint``, else a :class:`SeparateTokenizers`.

    Raises:
        ValueError: unknown ``model_type``, ``vocab_size`` below 300, no ``train`` split or no
            ``source``/``target`` columns, or no text to train on.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model_type must be one of {', '.join(map(repr, MODEL_TYPES))}; got {model_type!r}")
    min_size = len(SPECIAL_TOKENS) + len(BYTE_PIECES) + 40
    if vocab_size < min_size:
        raise ValueError(f"vocab_size must be at least {min_size} (4 special + 256 byte pieces + 40); got {vocab_size}")
    pairs = _training_pairs(dataset)

    def build(columns: tuple[str, ...]) -> PreTrainedTokenizerFast:
        backend = _train_backend(_texts(pairs, columns), vocab_size, model_type, max_piece_length, show_progress)
        return _wrap(backend, model_max_length)

    if joint:
        return build(("source", "target"))
    return SeparateTokenizers(source=build(("source",)), target=build(("target",)))


def _training_pairs(dataset: TextSource) -> datasets.Dataset:
    """The training text as a ``Dataset`` with ``source`` and ``target`` columns."""
    if isinstance(dataset, datasets.DatasetDict):
        if "train" not in dataset:
            raise ValueError(f"train_tokenizer needs a 'train' split; got splits {sorted(dataset)}")
        dataset = dataset["train"]
    if not isinstance(dataset, datasets.Dataset):
        pairs = [(str(s), str(t)) for s, t in dataset]
        dataset = datasets.Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    missing = {"source", "target"} - set(dataset.column_names)
    if missing:
        raise ValueError(
            f"train_tokenizer needs columns 'source' and 'target'; missing {sorted(missing)} "
            f"(columns: {dataset.column_names})"
        )
    if len(dataset) == 0:
        raise ValueError("train_tokenizer got no text to train on")
    return dataset


def _texts(dataset: datasets.Dataset, columns: tuple[str, ...]) -> Iterator[str]:
    """Stream the chosen columns in batches, without materializing the corpus as Python lists."""
    for batch in dataset.select_columns(list(columns)).iter(batch_size=1000):
        for column in columns:
            yield from batch[column]


def _train_backend(
    lines: Iterable[str], vocab_size: int, model_type: str, max_piece_length: int, show_progress: bool
) -> Tokenizer:
    special = list(SPECIAL_TOKENS)
    if model_type == "unigram":
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size - len(BYTE_PIECES),  # the byte pieces are added after training
            special_tokens=special,
            unk_token=UNK_TOKEN,
            max_piece_length=max_piece_length,
            show_progress=show_progress,
        )
    else:
        tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN, byte_fallback=True))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size - len(BYTE_PIECES),
            special_tokens=special,
            max_token_length=max_piece_length,
            show_progress=show_progress,
        )
    # Metaspace only marks word starts with "▁"; with split=True it splits on spaces, which
    # a Chinese sentence has few of, so Chinese is segmented by the subword model itself.
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tokenizer.train_from_iterator(lines, trainer=trainer)
    tokenizer = _add_byte_fallback(tokenizer)
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    # "▁" back to spaces, byte pieces back to characters, then drop the space that the
    # pre-tokenizer put in front of the first word (the SentencePiece/Llama decoder chain).
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, EOS_ID)],
    )
    for token, expected in zip(SPECIAL_TOKENS, range(len(SPECIAL_TOKENS))):
        if tokenizer.token_to_id(token) != expected:  # the DESIGN.md contract; a trainer change would break it
            raise RuntimeError(f"{token} got id {tokenizer.token_to_id(token)}, expected {expected}")
    return tokenizer


def _add_byte_fallback(tokenizer: Tokenizer) -> Tokenizer:
    """Append the 256 ``<0xXX>`` byte pieces to the trained vocabulary and switch byte fallback on.

    The trainers have no option to reserve byte pieces, so they are added to the serialized
    model, as SentencePiece does: for Unigram with a score below every learned piece, so they
    are only used for characters the vocabulary cannot spell; for BPE as merge-less tokens.
    """
    spec = json.loads(tokenizer.to_str())
    model = spec["model"]
    if model["type"] == "Unigram":
        # The trainer sums its EM statistics over threads in no fixed order, so two trainings on
        # the same text give scores that differ in the last bits, and pieces of near-equal score
        # in either order (other ids). Scores rounded to 1e-9 and sorted (score, then piece) make
        # the file, and so every run that trains one, reproducible.
        # The characters the trainer adds so that every text can be spelt sit below every learned
        # word piece, with scores in steps of 1e-4 handed out in hash-map order: the same scores
        # go to the characters in code-point order instead.
        special = [entry for entry in model["vocab"] if entry[0] in SPECIAL_TOKENS]
        learned = [[piece, round(score, 9)] for piece, score in model["vocab"] if piece not in SPECIAL_TOKENS]
        lowest_word = min((score for piece, score in learned if len(piece) > 1), default=float("inf"))
        spelling = [entry for entry in learned if len(entry[0]) == 1 and entry[1] < lowest_word]
        learned = [entry for entry in learned if not (len(entry[0]) == 1 and entry[1] < lowest_word)]
        spelling = [
            [piece, score]
            for piece, score in zip(sorted(p for p, _ in spelling), sorted((s for _, s in spelling), reverse=True))
        ]
        model["vocab"] = special + sorted(learned, key=lambda entry: (-entry[1], entry[0])) + spelling
        known = {piece for piece, _ in model["vocab"]}
        floor = min(score for _, score in model["vocab"]) - 10.0
        model["vocab"] += [[piece, floor] for piece in BYTE_PIECES if piece not in known]
        model["byte_fallback"] = True
    else:
        next_id = len(model["vocab"])
        for piece in BYTE_PIECES:
            if piece not in model["vocab"]:
                model["vocab"][piece] = next_id
                next_id += 1
        model["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def _wrap(backend: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        padding_side="right",
        # The decoder already returns detokenized text; the English-specific "clean up"
        # (" ." -> ".", " n't" -> "n't") would change correctly spaced text.
        clean_up_tokenization_spaces=False,
    )


# --------------------------------------------------------------------------------------------
# Subword regularization: a new segmentation of the training text every epoch
# --------------------------------------------------------------------------------------------


class SubwordSampler:
    """Sample segmentations of training text instead of always taking the best one.

    Subword regularization trains on a different segmentation of each sentence every epoch, so
    the model sees a word as several piece sequences and becomes robust to segmentation
    ambiguity; evaluation and translation keep the deterministic best segmentation.

    - Unigram tokenizers (``alpha``, ``nbest_size``): Kudo (2018), "Subword Regularization",
      §3.3: a segmentation x of a sentence X is drawn with probability ∝ P(x)^α, from its
      ``nbest_size`` most likely segmentations, or from every segmentation (forward-filtering
      backward-sampling over the lattice) when ``nbest_size`` is None. α → 0 approaches a uniform
      choice (many short pieces), large α the single best segmentation.
    - BPE tokenizers (``dropout``): Provilkov et al. (2020), "BPE-Dropout", §2: each merge is
      skipped with probability p while a word is segmented.

    Sampling is done by the `tokenizers` library on a private copy of the tokenizer (the given
    one keeps segmenting deterministically). Its random generator cannot be seeded, so two runs
    draw different segmentations.

    Args:
        tokenizer: the run's tokenizer (``PreTrainedTokenizerFast`` trained by
            :func:`train_tokenizer`), or a :class:`SeparateTokenizers` pair (both sides sampled).
        alpha: unigram smoothing exponent α > 0 (at most 1 without ``nbest_size``).
        nbest_size: unigram: sample among this many best segmentations (≥ 2), or None for all.
        dropout: BPE merge-dropout probability p in (0, 1).

    Raises:
        ValueError: an option that does not fit the tokenizer's model (``alpha``/``nbest_size``
            need Unigram, ``dropout`` needs BPE), a value out of range, or no option at all.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerFast | SeparateTokenizers,
        *,
        alpha: float | None = None,
        nbest_size: int | None = None,
        dropout: float | None = None,
    ) -> None:
        if alpha is None and dropout is None:
            raise ValueError("SubwordSampler needs alpha (Unigram tokenizers) or dropout (BPE tokenizers)")
        if alpha is not None and dropout is not None:
            raise ValueError("give alpha (Unigram) or dropout (BPE), not both")
        if alpha is not None and not alpha > 0:
            raise ValueError(f"alpha must be > 0; got {alpha}")
        if alpha is not None and nbest_size is None and alpha > 1.0:
            # tokenizers 0.23's lattice sampler overflows (a Rust panic, not an exception) there
            raise ValueError(
                f"alpha above 1 needs nbest_size (sampling over every segmentation takes alpha <= 1); got {alpha}"
            )
        if nbest_size is not None and (alpha is None or nbest_size < 2):
            raise ValueError(
                f"nbest_size needs alpha and must be at least 2 (or None: every segmentation); got {nbest_size}"
            )
        if dropout is not None and not 0.0 < dropout < 1.0:
            raise ValueError(f"dropout must be in (0, 1); got {dropout}")
        pair = tokenizer if isinstance(tokenizer, SeparateTokenizers) else (tokenizer, tokenizer)
        wanted = "Unigram" if alpha is not None else "BPE"
        option = "alpha" if alpha is not None else "dropout"
        self._backends = []
        for side in pair:
            backend = Tokenizer.from_str(side.backend_tokenizer.to_str())  # a copy: the original stays deterministic
            backend.no_padding()  # whatever a loaded tokenizer.json stored: one unpadded, uncut row per text
            backend.no_truncation()
            kind = type(backend.model).__name__
            if kind != wanted:
                raise ValueError(
                    f"subword sampling with {option} needs a {wanted} tokenizer; this one is {kind} "
                    f"(use {'dropout' if kind == 'BPE' else 'alpha'} for {kind})"
                )
            if alpha is not None:
                backend.model.alpha = alpha
                backend.model.nbest_size = nbest_size
            else:
                backend.model.dropout = dropout
            self._backends.append(backend)
        self.alpha, self.nbest_size, self.dropout = alpha, nbest_size, dropout

    def encode(self, texts: list[str], side: Literal["source", "target"] = "source") -> list[list[int]]:
        """A sampled segmentation of each text: ids of its pieces followed by ``</s>``, as the
        tokenizer's own ``tokenizer(texts)["input_ids"]`` (same post-processing)."""
        backend = self._backends[0 if side == "source" else 1]
        return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=True)]

    def resample(
        self,
        sources: list[str],
        targets: list[str],
        input_ids: list[list[int]],
        labels: list[list[int]],
        max_source_length: int,
        max_target_length: int,
    ) -> tuple[list[list[int]], list[list[int]], int]:
        """New ``input_ids``/``labels`` for the pairs (``sources[i]``, ``targets[i]``).

        A side whose sample is longer than its limit keeps its given (best) segmentation from
        ``input_ids``/``labels``, so the set of training pairs and the length limits never
        change. Returns ``(input_ids, labels, kept)``, ``kept`` counting the sides kept so.

        Raises:
            ValueError: lists of different lengths.
        """
        if not len(sources) == len(targets) == len(input_ids) == len(labels):
            raise ValueError(
                f"sources, targets, input_ids and labels must have one entry per pair; got "
                f"{len(sources)}, {len(targets)}, {len(input_ids)}, {len(labels)}"
            )
        kept = 0
        new_sides = []
        for texts, best, limit, side in (
            (sources, input_ids, max_source_length, "source"),
            (targets, labels, max_target_length, "target"),
        ):
            sampled = self.encode(texts, side)
            for i, ids in enumerate(sampled):
                if len(ids) > limit:
                    sampled[i] = best[i]
                    kept += 1
            new_sides.append(sampled)
        return new_sides[0], new_sides[1], kept
