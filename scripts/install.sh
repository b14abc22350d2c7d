#!/usr/bin/env bash
# The one install recipe, shared by the Makefile (local venv) and the Dockerfile (image).
#
#   scripts/install.sh PYTHON [EXTRAS]
#
# TORCH_INDEX_URL picks the torch build. Empty (the default) takes torch==$TORCH_VERSION from
# pip's configured sources; on this project's dev machines that is a CPU wheel already on disk, so
# nothing multi-GB is downloaded. Docker sets it to https://download.pytorch.org/whl/cpu or .../cu128.
# torch goes in first, on its own: the project's `torch>=...` range is then already satisfied and
# pip never swaps in a CUDA build behind our back.
set -euo pipefail
PY=${1:?usage: scripts/install.sh PYTHON [EXTRAS]}
EXTRAS=${2:-}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
HERE=$(cd "$(dirname "$0")/.." && pwd)

pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

if [ -n "${TORCH_INDEX_URL:-}" ]; then
  pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}"
else
  pip install --no-cache-dir "torch==${TORCH_VERSION}"
fi
target="$HERE"
[ -n "$EXTRAS" ] && target="$HERE[$EXTRAS]"
pip install --no-cache-dir -c "$HERE/constraints.txt" -e "$target"
