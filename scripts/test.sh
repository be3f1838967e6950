#!/usr/bin/env bash
# The test suite (the README's second command): every test, the slow end-to-end ones included,
# on 2 worker processes. Extra arguments go to pytest (e.g. -m "not slow" for a quick pass).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# transformers' own common model tests (tests/test_transformers_common.py) come from the source
# distribution of the installed transformers on PyPI, fetched once into ~/.cache/attention_seq2seq
# (tests/transformers_common_tests.py); offline and never fetched, that one test file skips.
"$VENV/bin/python" tests/transformers_common_tests.py || echo "[tests] tests/test_transformers_common.py will skip"
exec "$VENV/bin/python" -m pytest -n 2 --durations=15 "$@"
