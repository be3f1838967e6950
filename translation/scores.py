"""Corpus BLEU, chrF and TER with sacreBLEU, on detokenized text, with their signatures; the same per sentence.

Scores are computed on the detokenized model output against the *raw* reference strings of the
corpus (never against references that went through our tokenizer), so they are comparable with
published sacreBLEU numbers. The signature string records everything that changes the number
(tokenizer, smoothing, casing, version); it is stored next to every score in ``metrics.json``.
"""

from __future__ import annotations

from collections.abc import Sequence

# The one implementation of the scores is the package's evaluate module
# (attention_seq2seq/evaluate_modules/translation_scores): these functions, `evaluate.load` of that
# folder and the Seq2SeqTrainer's compute_metrics all run its compute_scores.py, which imports
# only sacrebleu (not evaluate, whose import costs seconds).
from attention_seq2seq.evaluate_modules.translation_scores import compute_scores as _scores


def load_translation_metric(target_lang: str | None = None, **load_kwargs):
    """``evaluate.load(TRANSLATION_METRIC_PATH)``: the package's BLEU/chrF metric, offline.

    ``target_lang`` (e.g. ``"zh"``) becomes the module's ``config_name``, its default target
    language (sacreBLEU's BLEU tokenizer for zh/ja/ko); ``load_kwargs`` go to ``evaluate.load``
    (``keep_in_memory=True``, ``experiment_id=...``). Imports ``evaluate`` (and ``datasets``).
    """
    import os

    import evaluate

    path = os.path.dirname(os.path.abspath(_scores.__file__))  # == attention_seq2seq.TRANSLATION_METRIC_PATH
    return evaluate.load(path, config_name=target_lang, **load_kwargs)


def bleu_tokenizer_for(target_lang: str | None) -> str:
    """sacreBLEU tokenizer name for a target language code (``"13a"`` unless zh/ja/ko)."""
    return _scores.bleu_tokenizer_for(target_lang)


def check_sentences(name: str, sentences) -> None:
    """Raise ``ValueError`` unless ``sentences`` is a sequence of strings, one per sentence.

    A bare string is itself a sequence of strings (its characters), so sacreBLEU would score each
    character as a sentence: ``corpus_scores(["abc"], "abc")`` gave chrF 100.
    """
    _scores.check_sentences(name, sentences)


def corpus_scores(
    hypotheses: Sequence[str], references: Sequence[str], target_lang: str | None = None, n_bootstrap: int = 1
) -> dict:
    """Corpus-level BLEU, chrF and TER of detokenized hypotheses against one reference each.

    Args:
        hypotheses: model outputs, one detokenized string per sentence.
        references: reference translations, same length and order.
        target_lang: language code of the target; picks sacreBLEU's tokenizer for BLEU.
        n_bootstrap: with more than 1, also the half-width of each score's 95% confidence interval
            from that many bootstrap resamples of the test sentences (Koehn 2004, "Statistical
            significance tests for machine translation evaluation"; sacreBLEU's implementation,
            seeded by ``SACREBLEU_SEED``, default 12345, so the interval is reproducible). 1000 is
            the usual number.

    Returns:
        ``{"bleu": float, "bleu_lowercase": float, "chrf": float, "ter": float, "bleu_signature": str,
        "bleu_lowercase_signature": str, "chrf_signature": str, "ter_signature": str}`` (scores on
        sacreBLEU's 0-100 scale; TER, edits per 100 reference words, is lower-is-better).
        ``bleu`` is cased; ``bleu_lowercase`` lower-cases both sides first, which is the
        closest sacreBLEU comes to the lower-cased word-level BLEU of many published tables.
        With ``n_bootstrap > 1`` also ``bleu_ci95``, ``bleu_lowercase_ci95``, ``chrf_ci95`` and
        ``ter_ci95``
        (BLEU points: the score is reported as score ± half-width), and the signatures gain
        sacreBLEU's ``bs:N|seed:S`` fields. The scores themselves are those of the whole test set.

    Raises:
        ValueError: ``hypotheses`` or ``references`` is a single string or holds something other
            than strings, the two lists differ in length or are empty, or ``n_bootstrap`` is below 1.
    """
    return _scores.translation_scores(hypotheses, references, target_lang=target_lang, n_bootstrap=n_bootstrap)


def sentence_scores(
    hypotheses: Sequence[str], references: Sequence[str], target_lang: str | None = None
) -> tuple[list[dict], dict]:
    """Per sentence ``{"bleu", "chrf", "ter"}`` (sentence BLEU with effective order, as ``sacrebleu
    -sl``), and the signatures; see ``compute_scores.sentence_scores``.

    Raises:
        ValueError: as :func:`corpus_scores`.
    """
    return _scores.sentence_scores(hypotheses, references, target_lang=target_lang)


#: The columns of :func:`write_sentence_scores`' file (its first line).
SENTENCE_SCORE_COLUMNS = ("line", "bleu", "chrf", "ter", "hypothesis", "reference")


def write_sentence_scores(
    path, hypotheses: Sequence[str], references: Sequence[str], target_lang: str | None = None
) -> dict:
    """Write ``evaluate --per-sentence FILE``: a header, then one tab-separated row per sentence:
    its 1-based line in the test set, sentence BLEU, chrF and TER (4 decimals, the numbers of
    ``sacrebleu REF -i HYP -sl -m bleu -w 4`` and likewise for ``chrf`` and ``ter``), the
    hypothesis and the reference (a tab inside either becomes a space, so every row has six fields).

    Returns:
        The signatures (``bleu_signature``, ``chrf_signature``, ``ter_signature``).

    Raises:
        ValueError: as :func:`corpus_scores`.
    """

    rows, signatures = sentence_scores(hypotheses, references, target_lang=target_lang)
    lines = ["\t".join(SENTENCE_SCORE_COLUMNS)]
    for number, (row, hyp, ref) in enumerate(zip(rows, hypotheses, references), start=1):
        texts = (hyp.replace("\t", " "), ref.replace("\t", " "))
        lines.append("\t".join([str(number), *(f"{row[m]:.4f}" for m in ("bleu", "chrf", "ter")), *texts]))
    from ..common.user_files import write_whole

    write_whole(path, "\n".join(lines) + "\n")  # a full disk leaves the old file whole
    return signatures


def format_score(result: dict, metric: str, digits: int = 2) -> str:
    """``"41.59"``, or ``"41.59 ± 1.62"`` when ``result`` (from `corpus_scores` with ``n_bootstrap > 1``)
    holds the 95% half-width ``<metric>_ci95`` (a None half-width counts as absent); ``metric`` is
    ``"bleu"``, ``"bleu_lowercase"``, ``"chrf"`` or ``"ter"``; ``digits`` after the decimal point."""
    interval = result.get(f"{metric}_ci95")
    return f"{result[metric]:.{digits}f}" + ("" if interval is None else f" ± {interval:.{digits}f}")
