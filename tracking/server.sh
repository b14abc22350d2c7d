#!/usr/bin/env bash
# Start the MLflow tracking server (see `python -m tracking.server --help`). Loopback only unless --host says
# otherwise; on a cluster's head node: tracking/server.sh --host 0.0.0.0 --allowed-hosts "$(hostname):5000"
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" -m tracking.server "$@"
