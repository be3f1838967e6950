"""The computation behind the translation_scores metric: corpus BLEU, lower-cased BLEU, chrF and TER,
and the same per sentence.

Plain sacreBLEU calls, with no evaluate or datasets import, so that the package's trainer and
commands (translation/scores.py) use the same code as ``evaluate.load(<this folder>)`` without paying
for importing evaluate (which imports datasets and transformers.pipelines: seconds). The metric
script, translation_scores.py, imports this file as ``from .compute_scores import ...``; evaluate
copies it next to the script (and fetches it with the script from a metric Space).

Scores are computed on detokenized hypotheses against the *raw* reference strings, one reference
per sentence, so they are comparable with published sacreBLEU numbers (Post 2018, "A Call for
Clarity in Reporting BLEU Scores"). Each score comes with its sacreBLEU signature, which records
everything that changes the number (tokenizer, smoothing, casing, version).
"""

import json

import sacrebleu

# sacreBLEU's own recommendation: the 13a tokenizer for most targets, a character-level one for
# Chinese, Japanese and Korean, whose text has no spaces between words.
BLEU_TOKENIZER_BY_LANG = {"zh": "zh", "ja": "char", "ko": "char"}


class _FloatScores:
    """Mixin: every score of a bootstrap resample is a Python float.

    sacreBLEU 2.x resamples float32 statistics; a resample with no matching n-gram (BLEU) or
    character (chrF) at all scores a Python ``0.0`` while the others score numpy float32, and its
    interval estimate (``statistics.mean``) then raises ``TypeError: don't know how to coerce
    float and float32``. That happens for weak systems on small test sets (an early checkpoint, a
    smoke test), so the interval of such a system is computed here instead of crashing.
    ``_compute_score_from_stats`` is where sacreBLEU scores each resample's summed statistics (a
    private method of sacreBLEU 2.x, which the package pins below 3; were it renamed, this
    override would go unused and the tests of near-zero systems would fail).
    """

    def _compute_score_from_stats(self, stats):
        score = super()._compute_score_from_stats(stats)
        score.score = float(score.score)
        return score


class _BLEU(_FloatScores, sacrebleu.BLEU):
    pass


class _CHRF(_FloatScores, sacrebleu.CHRF):
    pass


class _TER(_FloatScores, sacrebleu.TER):
    pass


def bleu_tokenizer_for(target_lang):
    """sacreBLEU tokenizer name for a target language code (``"13a"`` unless zh/ja/ko)."""
    if not target_lang:
        return "13a"
    return BLEU_TOKENIZER_BY_LANG.get(target_lang.split("-")[0].lower(), "13a")


def check_sentences(name, sentences):
    """Raise ``ValueError`` unless ``sentences`` is a sequence of strings, one per sentence.

    A bare string is itself a sequence of strings (its characters), so sacreBLEU would score each
    character as a sentence: ``translation_scores(["abc"], "abc")`` gave chrF 100.
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


def _check_inputs(hypotheses, references, tokenize) -> None:
    """Raise ``ValueError`` unless both are lists of strings of one length and ``tokenize`` is None
    or a sacreBLEU tokenizer."""
    check_sentences("hypotheses", hypotheses)
    check_sentences("references", references)
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses for {len(references)} references")
    if tokenize is not None and tokenize not in sacrebleu.BLEU.TOKENIZERS:
        raise ValueError(f"tokenize must be one of {', '.join(sacrebleu.BLEU.TOKENIZERS)}; got {tokenize!r}")


def translation_scores(hypotheses, references, target_lang=None, n_bootstrap=1, tokenize=None):
    """Corpus-level BLEU, lower-cased BLEU, chrF and TER of detokenized hypotheses, one reference each.

    Args:
        hypotheses: model outputs, one detokenized string per sentence.
        references: reference translations, same length and order.
        target_lang: language code of the target; picks sacreBLEU's tokenizer for BLEU
            (`bleu_tokenizer_for`).
        n_bootstrap: with more than 1, also the half-width of each score's 95% confidence interval
            from that many bootstrap resamples of the test sentences (Koehn 2004; sacreBLEU's
            implementation, seeded by ``SACREBLEU_SEED``, default 12345, so the interval is
            reproducible). 1000 is the usual number.
        tokenize: a sacreBLEU tokenizer name for BLEU; overrides ``target_lang`` when given.

    Returns:
        ``{"bleu", "bleu_lowercase", "chrf", "ter"}`` (floats on sacreBLEU's 0-100 scale; TER is
        the translation edit rate, edits per 100 reference words, lower is better: Snover et al.
        2006) and ``{"bleu_signature", "bleu_lowercase_signature", "chrf_signature",
        "ter_signature"}`` (strings). ``bleu``
        is cased; ``bleu_lowercase`` lower-cases both sides first, the closest sacreBLEU comes to
        the lower-cased word-level BLEU of many published tables. With ``n_bootstrap > 1`` also
        ``bleu_ci95``, ``bleu_lowercase_ci95``, ``chrf_ci95`` and ``ter_ci95`` (half-widths, in score points),
        and the signatures gain sacreBLEU's ``bs:N|seed:S`` fields. The scores themselves are
        those of the whole test set.

    Raises:
        ValueError: ``hypotheses`` or ``references`` is a single string or holds something other
            than strings, the two lists differ in length or are empty, ``n_bootstrap`` is below 1,
            or ``tokenize`` is not a sacreBLEU tokenizer.
    """
    _check_inputs(hypotheses, references, tokenize)
    if not references:
        raise ValueError("cannot score an empty corpus")
    if isinstance(n_bootstrap, bool) or not isinstance(n_bootstrap, int) or n_bootstrap < 1:
        raise ValueError(f"n_bootstrap must be 1 (no confidence interval) or more resamples; got {n_bootstrap!r}")
    bleu_tokenizer = tokenize or bleu_tokenizer_for(target_lang)
    hyps, refs = list(hypotheses), [list(references)]
    metrics = {
        "bleu": _BLEU(tokenize=bleu_tokenizer),
        "bleu_lowercase": _BLEU(tokenize=bleu_tokenizer, lowercase=True),
        "chrf": _CHRF(),
        "ter": _TER(),
    }
    result = {}
    signatures = {}
    for name, metric in metrics.items():
        score = metric.corpus_score(hyps, refs, n_bootstrap=n_bootstrap)
        signature = signatures[f"{name}_signature"] = str(metric.get_signature())
        result[name] = float(score.score)
        if n_bootstrap > 1:
            # sacreBLEU's public view of its interval; absent when every resample scores 0.
            as_json = json.loads(score.format(width=6, signature=signature, is_json=True))
            result[f"{name}_ci95"] = float(as_json.get("confidence_var", 0.0))
    return {**result, **signatures}


def sentence_scores(hypotheses, references, target_lang=None, tokenize=None):
    """BLEU, chrF and TER of each sentence on its own (what ``sacrebleu -sl`` prints), for error
    analysis and data filtering.

    Sentence BLEU uses sacreBLEU's effective order (n-gram orders the sentence has; without it a
    short sentence with no 4-gram match scores 0), the corpus BLEU's tokenizer and smoothing
    otherwise. Scores are on the 0-100 scale; TER lower is better.

    Returns:
        ``(rows, signatures)``: one ``{"bleu", "chrf", "ter"}`` dict per sentence, and the three
        metrics' sacreBLEU signatures (``bleu_signature``, ``chrf_signature``, ``ter_signature``).

    Raises:
        ValueError: as :func:`translation_scores`.
    """
    _check_inputs(hypotheses, references, tokenize)
    metrics = {
        "bleu": sacrebleu.BLEU(tokenize=tokenize or bleu_tokenizer_for(target_lang), effective_order=True),
        "chrf": sacrebleu.CHRF(),
        "ter": sacrebleu.TER(),
    }
    rows = [
        {name: float(metric.sentence_score(hyp, [ref]).score) for name, metric in metrics.items()}
        for hyp, ref in zip(hypotheses, references)
    ]
    return rows, {f"{name}_signature": str(metric.get_signature()) for name, metric in metrics.items()}
