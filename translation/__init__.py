"""Translation: loading a model from wherever it lives, the one translation engine (sort, batch,
``generate``, decode, n-best, scores, alignments) with its PyTorch and CTranslate2 backends,
files of any size (chunks, resume, ranks), and the scores (BLEU / chrF / TER through sacreBLEU)."""
