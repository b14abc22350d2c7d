#!/usr/bin/env bash
# Join this machine, with all its GPUs, to a head started by start-head.sh.
#
#   cluster/local/add-worker.sh HEAD_IP:PORT [extra `ray start` flags, e.g. --num-cpus=16 --block]
#
# Needs the head's token here first: ~/.ray/auth_token (scp it from the head), $RAY_AUTH_TOKEN_PATH or
# $RAY_AUTH_TOKEN. Never generates one: a new token would not match the head's. NUM_GPUS overrides the count.
# The code and the venv must be at the same path as on the head (Ray starts workers with that `python`).
set -euo pipefail
# shellcheck source=cluster/local/_common.sh
source "$(dirname "$0")/_common.sh"

ADDRESS=${1:?usage: cluster/local/add-worker.sh HEAD_IP:PORT [ray start flags]}
shift
if ! has_token; then
  echo "error: no token in $(describe_token); copy the head's: scp HEAD:.ray/auth_token ~/.ray/auth_token" >&2
  exit 2
fi
GPUS=$(count_gpus)
echo "joining ${ADDRESS} with ${GPUS} GPU(s); token from $(describe_token)"
exec ray start --address="$ADDRESS" --num-gpus="$GPUS" --disable-usage-stats "$@"
