#!/usr/bin/env bash
# Stop the Ray node(s) started on this machine by start-head.sh or add-worker.sh (`ray stop`: every Ray
# process of this user on this machine). Extra flags go to `ray stop`, e.g. --force.
set -euo pipefail
# shellcheck source=cluster/local/_common.sh
source "$(dirname "$0")/_common.sh"
exec ray stop "$@"
