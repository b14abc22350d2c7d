#!/usr/bin/env bash
# Stop the Ray node(s) started on this machine by start-head.sh or add-worker.sh (`ray stop`: every Ray
# process of this user on this machine), and first the `add-worker.sh --rejoin` supervisor, if any, so that it
# does not join again. Extra flags go to `ray stop`, e.g. --force.
set -euo pipefail
# shellcheck source=cluster/local/_common.sh
source "$(dirname "$0")/_common.sh"
if SUPERVISOR=$(rejoin_pid); then
  kill -TERM -- "-${SUPERVISOR}" 2>/dev/null || kill -TERM "$SUPERVISOR" 2>/dev/null || true
  echo "stopped the rejoin supervisor (pid ${SUPERVISOR})"
fi
rm -f "$(rejoin_file pid)"
exec ray stop "$@"
