#!/usr/bin/env bash
# The loop behind `add-worker.sh --rejoin` (not meant to be run by hand): keeps this machine in the cluster.
#
# `ray start --block` returns when a Ray process of this node exits unexpectedly: the raylet of a host that Ray
# declared dead (a lost link, a long pause) exits once it can talk to the head again ("marked as dead"), and a
# host Ray declared dead never rejoins by itself. `ray start --block` kills what is left of its node as it
# returns (not `ray stop`: that ends every Ray process of this user on the machine, and namespaces used as hosts
# share one process table); the node then joins again, as a fresh node, and the elastic run grows back onto it.
# Backs off 2, 4, ... 30 s while the head is unreachable.
# Ended by cluster/local/stop.sh (the pid file), or by signalling its process group.
set -uo pipefail
# shellcheck source=cluster/local/_common.sh
source "$(dirname "$0")/_common.sh"

ADDRESS=$1
shift
BACKOFF=2
trap 'exit 0' TERM INT
while :; do
  STARTED=$(date +%s)
  echo "$(date -u +%FT%TZ) rejoin: joining ${ADDRESS}"
  ray start --address="$ADDRESS" --disable-usage-stats --block "$@"
  RC=$?
  if (( $(date +%s) - STARTED > 60 )); then BACKOFF=2; fi
  echo "$(date -u +%FT%TZ) rejoin: ray start --block exited ${RC}; joining again in ${BACKOFF} s"
  sleep "$BACKOFF" & wait $!
  BACKOFF=$(( BACKOFF * 2 > 30 ? 30 : BACKOFF * 2 ))
done
