#!/usr/bin/env bash
# Create the separate JoeyNMT virtual environment used by benchmarks/bench_rnn.py as the peer
# side of the RNN benchmark. It lives at .venv-joeynmt in the repository (git-ignored) and is no
# part of the package's own dependencies.
#
# Working combination (checked on Python 3.11, Linux x86-64, CPU only):
#   torch==2.13.0 (CPU wheel, installed first and pinned again so nothing pulls a CUDA build)
#   joeynmt==2.3.0 with its declared requirements (protobuf>=3.19.4,<3.21 resolves to 3.20.x)
#   importlib_metadata (JoeyNMT 2.3 imports it and does not declare it)
# Usage: bash benchmarks/joeynmt_env.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-joeynmt}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[joeynmt-env] creating $VENV"
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch first, pinned, so JoeyNMT's open "torch>=1.12.0" is already satisfied by the CPU wheel.
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q "torch==2.13.0" "joeynmt==2.3.0" importlib_metadata
"$VENV/bin/python" -c "import torch, joeynmt, joeynmt.model; print('[joeynmt-env] ok: torch', torch.__version__, '| joeynmt', joeynmt.__version__)"
