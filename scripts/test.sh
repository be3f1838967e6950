#!/usr/bin/env bash
# The test suite (the README's second command): every test, the slow end-to-end ones included,
# on 2 worker processes. Extra arguments go to pytest (e.g. -m "not slow" for a quick pass).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$VENV/bin/python" -m pytest -n 2 --durations=15 "$@"
