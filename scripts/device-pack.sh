#!/usr/bin/env bash
# Pack the wheels a bare GPU machine lacks (Ray repacked without Java, pydantic, ...) into dist/device.
#
#   scripts/device-pack.sh [--out DIR] [--extra DIST] [--budget-mib N]     # = make device-pack
#   PYTHON_VERSION=3.11 scripts/device-pack.sh --out /tmp/pack             # for this machine's Python
#
# Exit 2: a wheel could not be downloaded, or wheels + project tree are over the budget. See
# scripts/device_pack.py for what is packed and why; docs/gpu.md for the device command that uses it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
[ -x "$PY" ] || PY=python3
exec "$PY" "$HERE/scripts/device_pack.py" "$@"
