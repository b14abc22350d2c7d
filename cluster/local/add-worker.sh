#!/usr/bin/env bash
# Join this machine, with all its GPUs, to a head started by start-head.sh.
#
#   cluster/local/add-worker.sh HEAD_IP:PORT [--rejoin] [extra `ray start` flags, e.g. --num-cpus=16]
#
# --rejoin keeps the machine in the cluster: a host that Ray declared dead (its link was down longer than the
# head's health check allows, see start-head.sh) never rejoins by itself; with --rejoin a supervisor joins it
# again as soon as its raylet exits, so an elastic run grows back onto it (the job of a pod restart on KubeRay).
# cluster/local/stop.sh ends the supervisor too; its log is ${TMPDIR:-/tmp}/elastic-train-rejoin.log.
#
# Needs the head's token here first: ~/.ray/auth_token (scp it from the head), $RAY_AUTH_TOKEN_PATH or
# $RAY_AUTH_TOKEN. Never generates one: a new token would not match the head's. NUM_GPUS overrides the count.
# The code and the venv must be at the same path as on the head (Ray starts workers with that `python`).
set -euo pipefail
# shellcheck source=cluster/local/_common.sh
source "$(dirname "$0")/_common.sh"

ADDRESS=${1:?usage: cluster/local/add-worker.sh HEAD_IP:PORT [--rejoin] [ray start flags]}
shift
REJOIN=0
FLAGS=()
for a in "$@"; do
  if [ "$a" = --rejoin ]; then REJOIN=1; else FLAGS+=("$a"); fi
done
if ! has_token; then
  echo "error: no token in $(describe_token); copy the head's: scp HEAD:.ray/auth_token ~/.ray/auth_token" >&2
  exit 2
fi
GPUS=$(count_gpus)
export_gloo_interface "$(node_ip "${FLAGS[@]}")"
if [ "$REJOIN" = 0 ]; then
  echo "joining ${ADDRESS} with ${GPUS} GPU(s); token from $(describe_token)"
  exec ray start --address="$ADDRESS" --num-gpus="$GPUS" --disable-usage-stats "${FLAGS[@]}"
fi

if has_flag --block "${FLAGS[@]}"; then
  echo "error: --rejoin runs 'ray start --block' itself; drop --block" >&2
  exit 2
fi
if SUPERVISOR=$(rejoin_pid); then
  echo "error: this machine is already kept in a cluster by pid ${SUPERVISOR}; cluster/local/stop.sh first" >&2
  exit 2
fi
LOG=$(rejoin_file log)
OFFSET=$(stat -c %s "$LOG" 2>/dev/null || echo 0)
echo "joining ${ADDRESS} with ${GPUS} GPU(s), rejoining whenever this node drops out; token from $(describe_token)"
setsid bash "$(dirname "$0")/_rejoin.sh" "$ADDRESS" --num-gpus="$GPUS" "${FLAGS[@]}" </dev/null >>"$LOG" 2>&1 &
echo $! >"$(rejoin_file pid)"
# Return once the first join is up (as plain `ray start` does), or fail with its output; bounded.
for _ in $(seq 1 240); do
  if tail -c +"$((OFFSET + 1))" "$LOG" | grep -q "will now block forever"; then
    echo "joined; supervisor pid $(cat "$(rejoin_file pid)"), log ${LOG}"
    exit 0
  fi
  if tail -c +"$((OFFSET + 1))" "$LOG" | grep -q "rejoin: ray start --block exited"; then
    kill -TERM -- "-$(cat "$(rejoin_file pid)")" 2>/dev/null || true
    rm -f "$(rejoin_file pid)"
    tail -c +"$((OFFSET + 1))" "$LOG" | grep -v "^[0-9T:-]*Z rejoin:" | tail -n 20 >&2
    echo "error: could not join ${ADDRESS} (the output above; all of it in ${LOG})" >&2
    exit 1
  fi
  sleep 0.5
done
echo "error: not joined to ${ADDRESS} after 120 s; the supervisor (pid $(cat "$(rejoin_file pid)")) keeps trying;" \
  "see ${LOG}, cluster/local/stop.sh ends it" >&2
exit 1
