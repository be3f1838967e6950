"""Corpus BLEU and chrF with sacreBLEU, on detokenized text, with their signatures.

Scores are computed on the detokenized model output against the *raw* reference strings of the
corpus (never against references that went through our tokenizer), so they are comparable with
published sacreBLEU numbers. The signature string records everything that changes the number
(tokenizer, smoothing, casing, version); it is stored next to every score in ``metrics.json``.
"""

from __future__ import annotations

from collections.abc import Sequence

from sacrebleu.metrics import BLEU, CHRF

# sacreBLEU's own recommendation: the 13a tokenizer for most targets, a character-level
# one for Chinese, whose text has no spaces between words.
_BLEU_TOKENIZER_BY_LANG = {"zh": "zh", "ja": "char", "ko": "char"}


def bleu_tokenizer_for(target_lang: str | None) -> str:
    """sacreBLEU tokenizer name for a target language code (``"13a"`` unless zh/ja/ko)."""
    if not target_lang:
        return "13a"
    return _BLEU_TOKENIZER_BY_LANG.get(target_lang.split("-")[0].lower(), "13a")


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], target_lang: str | None = None) -> dict:
    """Corpus-level BLEU and chrF of detokenized hypotheses against one reference each.

    Args:
        hypotheses: model outputs, one detokenized string per sentence.
        references: reference translations, same length and order.
        target_lang: language code of the target; picks sacreBLEU's tokenizer for BLEU.

    Returns:
        ``{"bleu": float, "bleu_lowercase": float, "chrf": float, "bleu_signature": str,
        "bleu_lowercase_signature": str, "chrf_signature": str}`` (scores on sacreBLEU's 0-100
        scale). ``bleu`` is cased; ``bleu_lowercase`` lower-cases both sides first, which is the
        closest sacreBLEU comes to the lower-cased word-level BLEU of many published tables.

    Raises:
        ValueError: the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses for {len(references)} references")
    if not references:
        raise ValueError("cannot score an empty corpus")
    hyps, refs = list(hypotheses), [list(references)]
    bleu = BLEU(tokenize=bleu_tokenizer_for(target_lang))
    bleu_lc = BLEU(tokenize=bleu_tokenizer_for(target_lang), lowercase=True)
    chrf = CHRF()
    return {
        "bleu": float(bleu.corpus_score(hyps, refs).score),
        "bleu_lowercase": float(bleu_lc.corpus_score(hyps, refs).score),
        "chrf": float(chrf.corpus_score(hyps, refs).score),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_lowercase_signature": str(bleu_lc.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
