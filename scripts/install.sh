#!/usr/bin/env bash
# Install everything attention-seq2seq needs on a fresh Debian machine (Python 3.10+, no GPU):
#   1. Debian packages (needs root or sudo): the SWORD Bible modules, the package's built-in offline
#      corpus; fonts-noto-cjk, so heat-map labels in Chinese, Japanese and Korean render
#      (attention/fonts.py); chromium, the browser the attention explorer's test drives
#      headless (Debian's build: nothing downloads a browser at run time);
#   2. a virtual environment .venv with the package (editable), its test tools, the explorer
#      and the CTranslate2 runtime and peft (the dev, demo, ct2, lora and onnx extras, so that their tests run).
# torch is pinned to 2.13.0 in pyproject.toml on purpose: on this kind of machine pip takes the
# CPU wheel; an open range could pull a multi-GB CUDA build.
# Usage: bash scripts/install.sh [VENV_DIR]     (default: .venv in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
PY=${PYTHON:-python3}

DEBIAN_PACKAGES="sword-text-sparv sword-text-web sword-text-kjv fonts-noto-cjk chromium"
if ! dpkg -s $DEBIAN_PACKAGES >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  echo "[install] Debian packages: $DEBIAN_PACKAGES"
  $SUDO apt-get update -qq
  # No recommends: chromium's would pull in a desktop's worth of services.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $DEBIAN_PACKAGES
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[install] creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
# pip's own notices (setuptools deprecations while building the editable wheel, index hints)
# go to a log file; it is shown if pip fails.
LOG="$VENV/install.log"
pip_quietly() {
  if ! "$VENV/bin/python" -m pip "$@" >>"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    echo "[install] pip $* failed; the whole log is $LOG" >&2
    exit 1
  fi
}
: >"$LOG"
pip_quietly install -q --upgrade pip
echo "[install] pip install -e .[dev,demo,ct2,lora,onnx] (torch 2.13.0 CPU wheel, transformers 5.24, accelerate 1.15, gradio, ctranslate2 4.x; log: $LOG)"
pip_quietly install -q -e ".[dev,demo,ct2,lora,onnx]"
"$VENV/bin/python" -c "import torch, transformers, accelerate, ctranslate2, peft, attention_seq2seq; print('[install] ok: torch', torch.__version__, '| transformers', transformers.__version__, '| accelerate', accelerate.__version__, '| ctranslate2', ctranslate2.__version__)"
