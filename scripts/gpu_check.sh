#!/usr/bin/env bash
# The GPU check (issue 33): one command, no arguments, at most ~8 minutes on one GPU, no downloads.
#
#   bash scripts/gpu_check.sh             on the GPU machine: install the carried wheels, then run
#                                         scripts/gpu_check.py (device tests, benchmarks, a short
#                                         accelerate-launched training run); results in $OUT or
#                                         runs/gpu-check/ (gpu_check.json, gpu_check.md)
#   bash scripts/gpu_check.sh --prepare   on a machine with registry access: the wheel folder for
#                                         Python 3.12 / manylinux x86-64, Multi30k and the benchmarks'
#                                         tokenizer, all under the git-ignored .gpu-check/ (carry it
#                                         whole), and the size check (<= 64 MiB)
#   bash scripts/gpu_check.sh --dry-run   the same stages on this CPU with tiny sizes, the versions
#                                         installed in .venv (no wheel install); CI runs it
#
# The GPU machine has Python 3.12, torch 2.11 (CUDA 13), transformers 5.17, accelerate 1.15,
# tokenizers, sacrebleu, pyarrow, pytest, psutil; it reaches no registry. What it lacks travels in
# .gpu-check/wheels (see WHEELS below) and is installed with --no-deps into a folder on PYTHONPATH,
# so its own torch stays. docs/gpu-check.md: how to run it with the device tool, what each figure means.
set -euo pipefail
cd "$(dirname "$0")/.."

CHECK_DIR=.gpu-check
WHEEL_DIR=$CHECK_DIR/wheels
DATA_DIR=$CHECK_DIR/data
LIMIT_MIB=64
# What the GPU machine lacks, pinned to the versions this project is tested with (pyproject.toml):
# transformers 5.24 (it has 5.17), datasets with the three of its needs it lacks or has in another
# version, regex at the version transformers 5.24 was tested with, and JoeyNMT 2.3 for the RNN
# benchmark's peer with the two modules its model code imports that the machine lacks.
WHEELS=(
  transformers==5.24.0 regex==2026.11.19
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.9.0
  joeynmt==2.3.0 importlib_metadata==8.7.0 subword-nmt==0.3.8
)

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

mode=run
case "${1:-}" in
  "") ;;
  --prepare) mode=prepare ;;
  --dry-run) mode=dry-run ;;
  -h|--help) usage; exit 0 ;;
  *) echo "gpu_check.sh: unknown option '$1'; valid: (none), --prepare, --dry-run, --help" >&2; exit 2 ;;
esac

tree_bytes() {  # what the device tool sends: tracked files plus untracked files git does not ignore
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}'
}

if [ "$mode" = prepare ]; then
  PY=${PYTHON:-python3}
  BUILD_PY=${BUILD_PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo "$PY" )}
  rm -rf "$WHEEL_DIR" && mkdir -p "$WHEEL_DIR"
  echo "[gpu-check] downloading ${#WHEELS[@]} wheels for CPython 3.12 / manylinux x86-64 into $WHEEL_DIR"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$WHEEL_DIR" "${WHEELS[@]}"
  echo "[gpu-check] building the attention-seq2seq wheel"
  "$BUILD_PY" -m pip wheel -q --no-deps -w "$WHEEL_DIR" . >/dev/null
  rm -rf build attention_seq2seq.egg-info ./*.egg-info
  SRC=${ATTN_SEQ2SEQ_SHARED_DATA:-../shared/data}/multi30k
  for split in train val test2016; do
    for lang in de en; do
      [ -f "$SRC/$split.$lang" ] || { echo "gpu_check.sh --prepare: $SRC/$split.$lang not found (Multi30k raw files; set ATTN_SEQ2SEQ_SHARED_DATA)" >&2; exit 2; }
    done
  done
  rm -rf "$DATA_DIR" && mkdir -p "$DATA_DIR/multi30k"
  cp "$SRC"/{train,val,test2016}.{de,en} "$DATA_DIR/multi30k/"
  [ -f "$SRC/../README.md" ] && cp "$SRC/../README.md" "$DATA_DIR/README.md"  # origin and licences of the corpora
  # The benchmarks' 8,000-piece tokenizer, trained here once (it costs the GPU machine ~20 s otherwise).
  echo "[gpu-check] training the benchmarks' tokenizer into $CHECK_DIR/bench-cache"
  rm -rf "$CHECK_DIR/bench-cache"
  ATTN_SEQ2SEQ_SHARED_DATA=$DATA_DIR BENCH_CACHE=$CHECK_DIR/bench-cache HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$BUILD_PY" -c "import sys; sys.path.insert(0, 'benchmarks'); from harness.data import build_tokenizer; build_tokenizer(8000)" >/dev/null
  tree=$(tree_bytes)
  wheels=$(du -sb "$WHEEL_DIR" | cut -f1)
  data=$(du -sb "$DATA_DIR" | cut -f1)
  total=$((tree + $(du -sb "$CHECK_DIR" | cut -f1)))
  ls -1 "$WHEEL_DIR"
  awk -v t="$tree" -v w="$wheels" -v d="$data" -v s="$total" -v l="$LIMIT_MIB" 'BEGIN {
    printf "[gpu-check] tree %.1f MiB + wheels %.1f MiB + data %.1f MiB (+ tokenizer) = %.1f MiB (limit %d MiB)\n", t/1048576, w/1048576, d/1048576, s/1048576, l }'
  if [ "$total" -gt $((LIMIT_MIB * 1048576)) ]; then
    echo "gpu_check.sh --prepare: the tree and $CHECK_DIR exceed ${LIMIT_MIB} MiB together; the device tool would refuse them" >&2
    exit 1
  fi
  echo "[gpu-check] ready: on the GPU, run scripts/gpu_check.sh with carry [\"$CHECK_DIR\"] (docs/gpu-check.md)"
  exit 0
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

if [ "$mode" = dry-run ]; then
  PY=${PYTHON:-.venv/bin/python}
  [ -x "$PY" ] || command -v "$PY" >/dev/null || { echo "gpu_check.sh --dry-run: no python at $PY (run scripts/install.sh, or set PYTHON)" >&2; exit 2; }
  exec "$PY" scripts/gpu_check.py --dry-run
fi

# ---- the GPU run ---------------------------------------------------------------------------------
PY=${PYTHON:-python3}
set +e
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)" 2>/dev/null
cuda=$?
set -e
if [ "$cuda" = 3 ]; then
  echo "gpu_check.sh: $("$PY" -c 'import torch; print("torch", torch.__version__)') sees no CUDA device on this machine; run it where a GPU is lent, or use --dry-run for the CPU rehearsal" >&2
  exit 3
elif [ "$cuda" != 0 ]; then
  echo "gpu_check.sh: $PY cannot import torch (set PYTHON to the interpreter that has the CUDA build of torch)" >&2
  exit 3
fi
if ! ls "$WHEEL_DIR"/attention_seq2seq-*.whl >/dev/null 2>&1; then
  echo "gpu_check.sh: no prepared wheels in $WHEEL_DIR; run 'bash scripts/gpu_check.sh --prepare' on a machine with registry access, then carry $WHEEL_DIR and $DATA_DIR" >&2
  exit 2
fi
SITE=${GPU_CHECK_SITE:-${TMPDIR:-/tmp}/attention-seq2seq-gpu-check-site}
echo "[gpu-check] installing $(ls "$WHEEL_DIR"/*.whl | wc -l) wheels into $SITE (--no-index --no-deps: the machine's torch stays)"
rm -rf "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check --target "$SITE" "$WHEEL_DIR"/*.whl
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
# -P: the repository root must not shadow the installed package (its attention_seq2seq/ folder is only part of it)
"$PY" -P -c "import torch, transformers, datasets, accelerate, attention_seq2seq.data, attention_seq2seq.training.train as t
print('[gpu-check] torch', torch.__version__, '| transformers', transformers.__version__, '| datasets', datasets.__version__,
      '| accelerate', accelerate.__version__, '| attention_seq2seq from', t.__file__)" \
  || { echo "gpu_check.sh: the installed wheels do not import (above); no stage was run" >&2; exit 2; }
exec "$PY" scripts/gpu_check.py "$@"
