#!/usr/bin/env bash
# The README's attention heat-maps: the cross-attention of three Multi30k test2016 sentences
# (its first three lines) for each trained run folder given, as PNGs in docs/images/attention/.
#
#   bash scripts/attention_figures.sh runs/multi30k-rnn-bahdanau runs/multi30k-rnn-luong runs/multi30k-transformer-small
#
# Each figure shows the model's own beam-5 translation re-read with output_attentions=True
# (`attention-seq2seq plot-attention`); for the Transformer, each decoder layer's head average.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
TEST_DE=${MULTI30K_DIR:-../shared/data/multi30k}/test2016.de
OUT=docs/images/attention
if [ $# -eq 0 ]; then
    echo "usage: bash scripts/attention_figures.sh RUN_DIR [RUN_DIR ...]" >&2
    exit 2
fi
[ -f "$TEST_DE" ] || { echo "error: $TEST_DE not found (set MULTI30K_DIR to the folder holding test2016.de)" >&2; exit 2; }
mkdir -p "$OUT"
for run in "$@"; do
    [ -d "$run/model" ] || { echo "error: $run/model not found: give finished training run folders" >&2; exit 2; }
    for i in 1 2 3; do
        source_sentence=$(sed -n "${i}p" "$TEST_DE")
        "$PY" -m attention_seq2seq.cli plot-attention -m "$run" --device cpu --num-beams 5 --no-per-head \
            --source "$source_sentence" -o "$OUT/$(basename "$run")_test$i.png"
    done
done
