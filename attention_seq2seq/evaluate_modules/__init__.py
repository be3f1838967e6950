"""evaluate modules shipped with the package: folders that ``evaluate.load(<folder>)`` loads offline.

``translation_scores/`` is the package's translation metric (corpus BLEU, lower-cased BLEU and chrF
with sacreBLEU signatures); its path is ``attention_seq2seq.TRANSLATION_METRIC_PATH``.
"""
