#!/usr/bin/env bash
# The README's first command: install (Debian SWORD modules + pip), then the main job on the
# built-in Bible corpus (train a Luong RNN and a Transformer-small with Accelerate, evaluate,
# export both as Hub-ready folders, load them with pipeline("translation", trust_remote_code=True)).
# About 10 minutes on 2 idle CPU cores; a fixed number of updates, so a busier machine takes longer
# and trains the same models. Arguments go to the job, e.g. --output-dir DIR, --quick (a smoke
# test), --minutes N (opt-in: N wall-clock minutes per model instead of the fixed updates).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh .venv
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m attention_seq2seq.main_job --overwrite "$@"
