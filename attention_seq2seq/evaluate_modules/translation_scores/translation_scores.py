"""Corpus BLEU (cased and lower-cased), chrF and TER with their sacreBLEU signatures, as an evaluate metric.

The one implementation of attention-seq2seq's translation scores is ``translation_scores`` in
compute_scores.py, next to this file: the package's trainer (validation and test), its ``evaluate``
command, the model card's model-index and the ``Seq2SeqTrainer`` fine-tuning path all compute their
numbers with it, and ``evaluate.load(<this folder>)`` exposes it as an ``evaluate.Metric`` (offline:
the folder ships inside the package, ``attention_seq2seq.TRANSLATION_METRIC_PATH``).

The folder is self-contained (the two files import only json, datasets, evaluate, sacrebleu and each
other, one import per line as evaluate's dependency scan wants; evaluate copies compute_scores.py
along with this script), so it can be pushed as a metric Space as it is.
"""

import datasets
import evaluate

from .compute_scores import translation_scores

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
    url = "https://www.aclweb.org/anthology/W18-6319",
}
"""

_DESCRIPTION = """\
Corpus-level BLEU (cased, and lower-cased on both sides), chrF and TER (translation edit rate,
lower is better) of detokenized translations
against one raw reference each, computed by sacreBLEU, each with its sacreBLEU signature. BLEU uses
sacreBLEU's recommended tokenizer for the target language: "zh" for Chinese, "char" for Japanese
and Korean, "13a" otherwise. Optionally each score's 95% confidence half-width from bootstrap
resamples of the test sentences (Koehn 2004; sacreBLEU's implementation, seeded). Cite sacreBLEU
(Post 2018, below) and the scores' papers: chrF (Popović 2015, WMT, pp. 392-395), TER (Snover et
al. 2006, AMTA, pp. 223-231), the bootstrap (Koehn 2004, EMNLP, pp. 388-395); their addresses are
the metric's reference_urls.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): detokenized model outputs, one string per sentence.
    references (list of str): one reference translation per sentence, same order.
    target_lang (str, optional): language code of the target ("en", "zh", "zh-Hans", ...): picks
        sacreBLEU's BLEU tokenizer. Defaults to the module's config_name
        (evaluate.load(path, config_name="zh")), else "13a".
    tokenize (str, optional): a sacreBLEU tokenizer name ("13a", "zh", "char", "intl", ...);
        overrides target_lang.
    n_bootstrap (int, optional): 1 (default) for no interval; N > 1 adds each score's 95%
        confidence half-width from N bootstrap resamples (1000 is usual).
Returns:
    bleu, bleu_lowercase, chrf, ter (float, 0-100; ter lower is better), bleu_signature,
    bleu_lowercase_signature, chrf_signature, ter_signature (str); with n_bootstrap > 1 also
    bleu_ci95, bleu_lowercase_ci95, chrf_ci95, ter_ci95
    (half-widths in score points; the signatures then carry sacreBLEU's bs:N|seed:S fields).
Examples:
    >>> metric = evaluate.load("path/to/translation_scores")
    >>> round(metric.compute(predictions=["The cat sat on the mat."], references=["The cat sat on a mat."])["bleu"], 2)
    48.89
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TranslationScores(evaluate.Metric):
    """``evaluate.Metric`` over `translation_scores`; ``config_name`` is an optional default
    target language (``evaluate.load(path, config_name="zh")``)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            homepage="https://github.com/mjpost/sacrebleu",
            license="Apache-2.0",
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Value("string"),
                }
            ),
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=[
                "https://www.aclweb.org/anthology/W18-6319",
                "https://aclanthology.org/W15-3049",
                "https://aclanthology.org/2006.amta-papers.25",
                "https://aclanthology.org/W04-3250",
            ],
        )

    def _compute(self, predictions, references, target_lang=None, tokenize=None, n_bootstrap=1):
        if target_lang is None and self.config_name != "default":
            target_lang = self.config_name
        return translation_scores(
            list(predictions), list(references), target_lang=target_lang, n_bootstrap=n_bootstrap, tokenize=tokenize
        )
