"""Word alignments from attention, in Pharaoh format, and their alignment error rate.

A Pharaoh line lists the links of one sentence pair as ``i-j`` (0-based source word ``i``
aligned to target word ``j``), separated by spaces; gold files may also hold possible links
``i?j`` (Och & Ney 2003, "A Systematic Comparison of Various Statistical Alignment Models",
Computational Linguistics 29(1), §4.1). Words are the whitespace-separated words of each text;
the model's subword pieces are mapped to them by character offsets, so a word split into several
pieces is one word.

Hard alignment from attention (as fairseq's ``--print-alignment`` and OpenNMT-py's
``-report_align`` do): for every target piece t, the source piece with the largest cross-attention
weight while predicting t (special tokens such as ``</s>`` excluded); source word i and target
word j are linked when any of their pieces are (the union over pieces).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch

from ..common.errors import UserError
from .sentences import attention_pass

_WORD = re.compile(r"\S+")

Link = tuple[int, int]


# ---------------------------------------------------------------------------------------------
# Pharaoh format and AER


def format_pharaoh(links: Iterable[Link]) -> str:
    """``{(0, 0), (2, 1)}`` → ``"0-0 2-1"`` (sorted by source, then target word)."""
    return " ".join(f"{i}-{j}" for i, j in sorted(set(links)))


def parse_pharaoh(line: str, *, where: str = "alignment") -> tuple[set[Link], set[Link]]:
    """One Pharaoh line → (sure, possible) link sets; ``possible`` includes ``sure`` (S ⊆ P).

    ``i-j`` is a sure link, ``i?j`` a possible one (Och & Ney 2003). Raises :class:`UserError`
    naming ``where`` (e.g. ``gold.txt line 3``) and the bad item.
    """
    sure: set[Link] = set()
    possible: set[Link] = set()
    for item in line.split():
        match = re.fullmatch(r"(\d+)([-?])(\d+)", item)
        if match is None:
            raise UserError(
                f"{where}: {item!r} is not a link; expected i-j (sure) or i?j (possible), 0-based word indices"
            )
        link = (int(match.group(1)), int(match.group(3)))
        possible.add(link)
        if match.group(2) == "-":
            sure.add(link)
    return sure, possible


@dataclass
class AERCounts:
    """Corpus-level counts of Och & Ney (2003), eq. 19 summed over sentences."""

    a: int = 0  # |A|, hypothesis links
    s: int = 0  # |S|, sure gold links
    a_and_s: int = 0  # |A ∩ S|
    a_and_p: int = 0  # |A ∩ P|

    def add(self, hypothesis: set[Link], sure: set[Link], possible: set[Link]) -> None:
        possible = possible | sure
        self.a += len(hypothesis)
        self.s += len(sure)
        self.a_and_s += len(hypothesis & sure)
        self.a_and_p += len(hypothesis & possible)

    @property
    def aer(self) -> float:
        """AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|); 0 is perfect. 0/0 (no links at all) gives 0."""
        total = self.a + self.s
        return 0.0 if total == 0 else 1.0 - (self.a_and_s + self.a_and_p) / total

    @property
    def precision(self) -> float:
        """|A∩P| / |A|."""
        return self.a_and_p / self.a if self.a else 0.0

    @property
    def recall(self) -> float:
        """|A∩S| / |S|."""
        return self.a_and_s / self.s if self.s else 0.0


def alignment_error_rate(
    hypotheses: Sequence[str], gold: Sequence[str], *, hyp_name: str = "hypothesis", gold_name: str = "gold"
) -> AERCounts:
    """AER of Pharaoh ``hypotheses`` (``i-j``; a ``?`` there counts as a link too) against ``gold``
    lines (``i-j`` sure, ``i?j`` possible), one line per sentence pair.

    Raises :class:`UserError` when the line counts differ or a line is malformed.
    """
    if len(hypotheses) != len(gold):
        raise UserError(
            f"{hyp_name} has {len(hypotheses)} lines but {gold_name} has {len(gold)}; they must be line-aligned"
        )
    counts = AERCounts()
    for number, (hyp_line, gold_line) in enumerate(zip(hypotheses, gold), start=1):
        _, hyp = parse_pharaoh(hyp_line, where=f"{hyp_name} line {number}")
        sure, possible = parse_pharaoh(gold_line, where=f"{gold_name} line {number}")
        counts.add(hyp, sure, possible)
    return counts


# ---------------------------------------------------------------------------------------------
# Pieces → words


def piece_words(text: str, offsets: Sequence[tuple[int, int]]) -> list[int | None]:
    """Word index (whitespace-separated words of ``text``) of each piece, from its character
    offsets; None for pieces with no characters (special tokens such as ``</s>``).

    A piece goes to the word it overlaps most (a SentencePiece ``▁`` piece may include the space
    before its word in its offsets); a piece of whitespace only (a bare ``▁``) to the next word.
    """
    spans = [m.span() for m in _WORD.finditer(text)]
    result: list[int | None] = []
    w = 0
    for start, end in offsets:
        if end <= start:
            result.append(None)
            continue
        best, best_overlap = None, 0
        # Words and pieces both run left to right: scan from the last word matched.
        for k in range(max(0, w - 1), len(spans)):
            ws, we = spans[k]
            if ws >= end:
                break
            overlap = min(end, we) - max(start, ws)
            if overlap > best_overlap:
                best, best_overlap = k, overlap
        if best is None:
            # Only whitespace (a bare "▁" piece): it belongs to the word that follows.
            best = next((k for k in range(w, len(spans)) if spans[k][0] >= start), None)
        if best is not None:
            w = best
        result.append(best)
    return result


def word_links(weights: torch.Tensor, src_words: Sequence[int | None], tgt_words: Sequence[int | None]) -> set[Link]:
    """Word links from one sentence pair's attention matrix.

    Args:
        weights: (tgt_len, src_len) attention; row t is the attention while predicting target
            piece t.
        src_words, tgt_words: the word index of each source/target piece (None: a special token,
            excluded on both sides).

    Returns:
        {(source word, target word)}: for each target piece the source piece of largest weight
        among the real ones, merged to words.
    """
    real_src = [k for k, w in enumerate(src_words) if w is not None]
    if not real_src:
        return set()
    columns = torch.tensor(real_src, device=weights.device)
    best = weights[: len(tgt_words)].index_select(1, columns).argmax(dim=1).tolist()  # (tgt_len,)
    links = set()
    for t, word in enumerate(tgt_words):
        if word is not None and t < len(best):
            links.add((src_words[real_src[best[t]]], word))
    return links


# ---------------------------------------------------------------------------------------------
# Attention of a model


def select_attention(cross_attentions: Sequence[torch.Tensor], layer: int, heads: Sequence[int] | None) -> torch.Tensor:
    """One (batch, tgt_len, src_len) matrix from a model's ``cross_attentions``.

    Args:
        cross_attentions: one (batch, num_heads, tgt_len, src_len) tensor per decoder layer (the
            RNN gives one layer with one head).
        layer: decoder layer, 0-based; negative counts from the last (-1: the last layer).
        heads: heads to average (0-based); None: all heads.

    Raises :class:`UserError` for a layer or head the model does not have.
    """
    num_layers = len(cross_attentions)
    if not -num_layers <= layer < num_layers:
        raise UserError(
            f"--align-layer {layer}: the model has {num_layers} decoder layer(s) with cross-attention; "
            f"use 0..{num_layers - 1} or -1 for the last"
        )
    weights = cross_attentions[layer]  # (batch, num_heads, tgt_len, src_len)
    num_heads = weights.size(1)
    if heads:
        bad = [h for h in heads if not 0 <= h < num_heads]
        if bad:
            raise UserError(
                f"--align-heads {','.join(map(str, heads))}: layer {layer} has {num_heads} head(s); "
                f"use indices 0..{num_heads - 1}"
            )
        weights = weights[:, list(heads)]
    return weights.float().mean(dim=1)  # (batch, tgt_len, src_len)


@torch.inference_mode()
def attention_alignments(
    model,
    tokenizer,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    layer: int = -1,
    heads: Sequence[int] | None = None,
    max_source_length: int | None = None,
) -> list[set[Link]]:
    """Word alignments of (source, target) pairs from the model's cross-attention, by teacher
    forcing each target (the model's own translation or a reference) in one batch: the attention
    pass of ``modeling/attention_pass.py`` (eager attention for the call only).

    Returns one set of (source word, target word) links per pair, 0-based.

    Raises:
        UserError: ``layer`` or ``heads`` the model does not have, or a model without
            cross-attention.
    """
    if not sources:
        return []
    forced = _forced_attention(model, tokenizer, sources, targets, max_source_length)
    return _links_of_layer(forced, sources, targets, layer, heads)


def _forced_attention(model, tokenizer, sources, targets, max_source_length=None):
    """The attention pass over (source, target) pairs, with the character offsets of every piece."""
    sentences = attention_pass(
        model, tokenizer, list(sources), list(targets), max_source_length=max_source_length, offsets=True
    ).sentences
    if any(sentence.cross is None for sentence in sentences):
        raise UserError("the model returns no cross-attention (attention='none'): there is nothing to align")
    return sentences


def _links_of_layer(sentences, sources, targets, layer, heads) -> list[set[Link]]:
    result = []
    for sentence, source, target in zip(sentences, sources, targets):
        cross = [weights[None] for weights in sentence.cross]  # (1, num_heads, tgt_len, src_len) per layer
        weights = select_attention(cross, layer, heads)[0].cpu()  # (tgt_len, src_len)
        src_words = piece_words(source, sentence.source_offsets)
        tgt_words = piece_words(target, sentence.target_offsets)
        result.append(word_links(weights, src_words, tgt_words))
    return result


def model_alignments_by_layer(
    model,
    tokenizer,
    sources: Sequence[str],
    targets: Sequence[str],
    *,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    batch_size: int = 16,
) -> list[tuple[int, list[str]]]:
    """Pharaoh lines of every (source, target) pair for each decoder layer (or only ``layer``),
    by teacher forcing the targets: ``[(layer, lines), ...]``. An empty source or target gets an
    empty line."""
    num_layers = 1 if model.config.model_type == "rnn_seq2seq" else model.config.decoder_layers
    layers = list(range(num_layers)) if layer is None else [layer]
    lines = {k: [""] * len(sources) for k in layers}
    keep = [k for k in range(len(sources)) if sources[k].strip() and targets[k].strip()]
    for start in range(0, len(keep), batch_size):
        batch = keep[start : start + batch_size]
        batch_sources, batch_targets = [sources[i] for i in batch], [targets[i] for i in batch]
        with torch.inference_mode():
            forced = _forced_attention(model, tokenizer, batch_sources, batch_targets)
        for k in layers:
            for i, links in zip(batch, _links_of_layer(forced, batch_sources, batch_targets, k, heads)):
                lines[k][i] = format_pharaoh(links)
    return [(k, lines[k]) for k in layers]


# ---------------------------------------------------------------------------------------------
# The alignment-error-rate command


@dataclass
class AERFiles:
    """The line-aligned texts the ``alignment-error-rate`` command scores.

    Attributes:
        gold: the gold Pharaoh lines (``i-j`` sure, ``i?j`` possible links).
        gold_name: how messages name the gold file (its path).
        hypothesis: the Pharaoh lines to score, or None when a model aligns ``sources`` with
            ``references``.
        hypothesis_name: how messages name the hypothesis file.
        sources, references: the sentence pairs a model aligns (None with a hypothesis file).
    """

    gold: list[str]
    gold_name: str
    hypothesis: list[str] | None = None
    hypothesis_name: str = "hypothesis"
    sources: list[str] | None = None
    references: list[str] | None = None


def read_aer_files(
    gold: str | Path,
    *,
    hypothesis: str | Path | None = None,
    src: str | Path | None = None,
    ref: str | Path | None = None,
) -> AERFiles:
    """Read the gold file and either a hypothesis file or the ``src`` / ``ref`` sentence files.

    Raises:
        UserError: a file does not exist (named by its command-line option: ``--gold``,
            ``HYPOTHESIS``, ``--src``, ``--ref``), or ``src`` and ``ref`` differ in line count.
    """
    named = [("--gold", gold)] + ([("HYPOTHESIS", hypothesis)] if hypothesis else [("--src", src), ("--ref", ref)])
    texts = {}
    for option, path in named:
        if not Path(path).is_file():
            raise UserError(f"{option}: file not found: {path}")
        texts[option] = Path(path).read_text(encoding="utf-8").splitlines()
    if hypothesis:
        return AERFiles(texts["--gold"], str(gold), hypothesis=texts["HYPOTHESIS"], hypothesis_name=str(hypothesis))
    if len(texts["--src"]) != len(texts["--ref"]):
        raise UserError(f"--src has {len(texts['--src'])} lines but --ref has {len(texts['--ref'])}")
    return AERFiles(texts["--gold"], str(gold), sources=texts["--src"], references=texts["--ref"])


@dataclass
class AERReport:
    """Corpus AER counts per scored alignment: ``rows`` is ``[("file", counts)]`` for a hypothesis
    file, ``[("layer 0", counts), ...]`` for a model's layers; ``num_sentences`` the gold lines."""

    rows: list[tuple[str, AERCounts]]
    num_sentences: int
    per_layer: bool

    def as_dict(self) -> dict:
        """``{"aer", "precision", "recall", "links", "sure_links"}`` of a file, or those per layer
        (``{"layer 0": {...}, ...}``) for a model."""
        result = {
            name: {"aer": c.aer, "precision": c.precision, "recall": c.recall, "links": c.a, "sure_links": c.s}
            for name, c in self.rows
        }
        return result if self.per_layer else result["file"]

    def lines(self) -> list[str]:
        """One line per row: ``[layer L: ]AER a  precision p  recall r  (n links, m sure gold links,
        k sentences)``."""
        return [
            f"{name + ': ' if self.per_layer else ''}AER {c.aer:.4f}  precision {c.precision:.4f}  "
            f"recall {c.recall:.4f}  ({c.a} links, {c.s} sure gold links, {self.num_sentences} sentences)"
            for name, c in self.rows
        ]


def score_aer_files(
    files: AERFiles, model=None, tokenizer=None, *, layer: int | None = None, heads: Sequence[int] | None = None
) -> AERReport:
    """AER of ``files``: of its hypothesis file, or of ``model``'s attention alignments of its
    sentence pairs (every decoder layer, or only ``layer``; ``heads`` averaged, default all),
    against the gold lines.

    Raises:
        UserError: line counts that differ from the gold file's, a malformed Pharaoh line, or a
            layer / head the model does not have.
    """
    if files.hypothesis is not None:
        counts = alignment_error_rate(
            files.hypothesis, files.gold, hyp_name=files.hypothesis_name, gold_name=files.gold_name
        )
        return AERReport([("file", counts)], len(files.gold), per_layer=False)
    rows = []
    for k, lines in model_alignments_by_layer(
        model, tokenizer, files.sources, files.references, layer=layer, heads=heads
    ):
        rows.append(
            (f"layer {k}", alignment_error_rate(lines, files.gold, hyp_name=f"layer {k}", gold_name=files.gold_name))
        )
    return AERReport(rows, len(files.gold), per_layer=True)
