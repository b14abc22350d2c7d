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
#
# CONSTRAINTS (default constraints.txt, the newest tested set; constraints-oldest.txt the oldest) pins every
# package. RAY_VERSION / MLFLOW_VERSION match a cluster's: then only those two (and torch) are pinned and pip
# resolves the rest within pyproject.toml's ranges, since the tested sets pin neighbours to their own Ray and
# MLflow. The project's install is one pip call: a version the index does not have fails in pip's resolver,
# with pip's message, before anything in the venv changes.
set -euo pipefail
PY=${1:?usage: scripts/install.sh PYTHON [EXTRAS]}
EXTRAS=${2:-}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
HERE=$(cd "$(dirname "$0")/.." && pwd)
CONSTRAINTS=${CONSTRAINTS:-$HERE/constraints.txt}

pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

if [ -n "${TORCH_INDEX_URL:-}" ]; then
  pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}"
else
  pip install --no-cache-dir "torch==${TORCH_VERSION}"
fi
target="$HERE"
[ -n "$EXTRAS" ] && target="$HERE[$EXTRAS]"
if [ -n "${RAY_VERSION:-}${MLFLOW_VERSION:-}" ]; then
  pins=$(mktemp)
  trap 'rm -f "$pins"' EXIT
  echo "torch==${TORCH_VERSION}" >"$pins"
  [ -n "${RAY_VERSION:-}" ] && echo "ray==${RAY_VERSION}" >>"$pins"
  [ -n "${MLFLOW_VERSION:-}" ] && echo "mlflow==${MLFLOW_VERSION}" >>"$pins"
  # MLflow before 3.9 imports a pool SQLAlchemy 2.1 removed, though it allows sqlalchemy<3 (launch/versions.py)
  case "${MLFLOW_VERSION:-}" in 3.[5-8].*|3.[5-8]) echo "sqlalchemy<2.1" >>"$pins" ;; esac
  CONSTRAINTS=$pins
fi
pip install --no-cache-dir -c "$CONSTRAINTS" -e "$target"
