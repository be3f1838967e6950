"""Corpus BLEU and chrF with sacreBLEU, on detokenized text, with their signatures.

Scores are computed on the detokenized model output against the *raw* reference strings of the
corpus (never against references that went through our tokenizer), so they are comparable with
published sacreBLEU numbers. The signature string records everything that changes the number
(tokenizer, smoothing, casing, version); it is stored next to every score in ``metrics.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF

# sacreBLEU's own recommendation: the 13a tokenizer for most targets, a character-level
# one for Chinese, whose text has no spaces between words.
_BLEU_TOKENIZER_BY_LANG = {"zh": "zh", "ja": "char", "ko": "char"}


class _FloatScores:
    """Mixin: every score of a bootstrap resample is a Python float.

    sacreBLEU 2.x resamples float32 statistics; a resample with no matching n-gram (BLEU) or
    character (chrF) at all scores a Python ``0.0`` while the others score numpy float32, and its
    interval estimate (``statistics.mean``) then raises ``TypeError: don't know how to coerce
    float and float32``. That happens for weak systems on small test sets (an early checkpoint, a
    smoke test), so the interval of such a system is computed here instead of crashing.
    ``_compute_score_from_stats`` is where sacreBLEU scores each resample's summed statistics (a
    private method of sacreBLEU 2.x, which pyproject.toml pins below 3; were it renamed, this
    override would go unused and the tests of near-zero systems would fail).
    """

    def _compute_score_from_stats(self, stats):
        score = super()._compute_score_from_stats(stats)
        score.score = float(score.score)
        return score


class _BLEU(_FloatScores, BLEU):
    pass


class _CHRF(_FloatScores, CHRF):
    pass


def bleu_tokenizer_for(target_lang: str | None) -> str:
    """sacreBLEU tokenizer name for a target language code (``"13a"`` unless zh/ja/ko)."""
    if not target_lang:
        return "13a"
    return _BLEU_TOKENIZER_BY_LANG.get(target_lang.split("-")[0].lower(), "13a")


def check_sentences(name: str, sentences) -> None:
    """Raise ``ValueError`` unless ``sentences`` is a sequence of strings, one per sentence.

    A bare string is itself a sequence of strings (its characters), so sacreBLEU would score each
    character as a sentence: ``corpus_scores(["abc"], "abc")`` gave chrF 100.
    """
    if isinstance(sentences, (str, bytes)):
        raise ValueError(
            f"{name} must be a list of strings, one per sentence; got a single string "
            f"(wrap it in a list: [{sentences[:20]!r}{'...' if len(sentences) > 20 else ''}])"
        )
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise ValueError(
                f"{name}[{index}] must be a string (one {name[:-1]} per sentence); got {type(sentence).__name__}"
            )


def corpus_scores(
    hypotheses: Sequence[str], references: Sequence[str], target_lang: str | None = None, n_bootstrap: int = 1
) -> dict:
    """Corpus-level BLEU and chrF of detokenized hypotheses against one reference each.

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
        ``{"bleu": float, "bleu_lowercase": float, "chrf": float, "bleu_signature": str,
        "bleu_lowercase_signature": str, "chrf_signature": str}`` (scores on sacreBLEU's 0-100
        scale). ``bleu`` is cased; ``bleu_lowercase`` lower-cases both sides first, which is the
        closest sacreBLEU comes to the lower-cased word-level BLEU of many published tables.
        With ``n_bootstrap > 1`` also ``bleu_ci95``, ``bleu_lowercase_ci95`` and ``chrf_ci95``
        (BLEU points: the score is reported as score ± half-width), and the signatures gain
        sacreBLEU's ``bs:N|seed:S`` fields. The scores themselves are those of the whole test set.

    Raises:
        ValueError: ``hypotheses`` or ``references`` is a single string or holds something other
            than strings, the two lists differ in length or are empty, or ``n_bootstrap`` is below 1.
    """
    check_sentences("hypotheses", hypotheses)
    check_sentences("references", references)
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        raise ValueError("cannot score an empty corpus")
    if n_bootstrap < 1:
        raise ValueError(f"n_bootstrap must be 1 (no confidence interval) or more resamples; got {n_bootstrap}")
    hyps, refs = list(hypotheses), [list(references)]
    metrics = {
        "bleu": _BLEU(tokenize=bleu_tokenizer_for(target_lang)),
        "bleu_lowercase": _BLEU(tokenize=bleu_tokenizer_for(target_lang), lowercase=True),
        "chrf": _CHRF(),
    }
    result: dict = {}
    signatures: dict = {}
    for name, metric in metrics.items():
        score = metric.corpus_score(hyps, refs, n_bootstrap=n_bootstrap)
        signature = signatures[f"{name}_signature"] = str(metric.get_signature())
        result[name] = float(score.score)
        if n_bootstrap > 1:
            # sacreBLEU's public view of its interval; absent when every resample scores 0.
            as_json = json.loads(score.format(width=6, signature=signature, is_json=True))
            result[f"{name}_ci95"] = float(as_json.get("confidence_var", 0.0))
    return {**result, **signatures}


def format_score(result: dict, metric: str, digits: int = 2) -> str:
    """``"41.59"``, or ``"41.59 ± 1.62"`` when ``result`` (from `corpus_scores` with ``n_bootstrap > 1``)
    holds the 95% half-width ``<metric>_ci95`` (a None half-width counts as absent); ``metric`` is
    ``"bleu"``, ``"bleu_lowercase"`` or ``"chrf"``; ``digits`` after the decimal point."""
    interval = result.get(f"{metric}_ci95")
    return f"{result[metric]:.{digits}f}" + ("" if interval is None else f" ± {interval:.{digits}f}")
