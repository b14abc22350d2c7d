# Sourced by start-head.sh and add-worker.sh: the venv, the GPU count, and the token.
# shellcheck shell=bash

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Use the project's venv when there is one and no other is active: Ray starts job entrypoints (`python -m
# jobs.train`) and workers with the `python` found on the PATH of `ray start`, so every node must see the same
# venv. An activated venv ($VIRTUAL_ENV: e.g. one made by `make test-versions` for another Ray) wins.
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$REPO/.venv/bin/ray" ]; then
  export PATH="$REPO/.venv/bin:$PATH"
fi
command -v ray >/dev/null || { echo "error: no 'ray' on PATH; run 'make install' (or activate your env)" >&2; exit 2; }

# Token authentication on, explicitly (Ray only turns it on by itself when a token already exists).
export RAY_AUTH_MODE=token
export RAY_USAGE_STATS_ENABLED=${RAY_USAGE_STATS_ENABLED:-0}
TOKEN_FILE=${RAY_AUTH_TOKEN_PATH:-$HOME/.ray/auth_token}

count_gpus() {
  # NUM_GPUS wins; then CUDA_VISIBLE_DEVICES (what this node may use); then what nvidia-smi lists.
  if [ -n "${NUM_GPUS:-}" ]; then
    echo "$NUM_GPUS"
  elif [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then
    if [ -z "$CUDA_VISIBLE_DEVICES" ]; then echo 0; else echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .; fi
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

describe_token() {
  if [ -n "${RAY_AUTH_TOKEN:-}" ]; then echo "\$RAY_AUTH_TOKEN"; else echo "$TOKEN_FILE"; fi
}

has_token() {
  [ -n "${RAY_AUTH_TOKEN:-}" ] || [ -s "$TOKEN_FILE" ]
}

has_flag() {  # has_flag --block "$@"
  local flag=$1; shift
  for a in "$@"; do [ "$a" = "$flag" ] && return 0; done
  return 1
}

rejoin_file() {  # rejoin_file pid|log: the --rejoin supervisor's files on this machine
  echo "${TMPDIR:-/tmp}/elastic-train-rejoin.$1"
}

rejoin_pid() {  # prints the live supervisor's pid; fails when there is none
  local file pid
  file=$(rejoin_file pid)
  [ -s "$file" ] || return 1
  pid=$(cat "$file")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

# Ray's public settings for this node's raylet, which every worker process it starts inherits (a value exported
# before the script wins): workers at niceness 0, not Ray's 15 (a training worker that fills the cores otherwise
# loses each time slice to any nice-0 process that wakes up; docs/clusters.md), and gloo on the interface that
# holds this node's Ray address (where the hostname resolves to 127.0.0.1, a two-host process group fails).
export RAY_worker_niceness=${RAY_worker_niceness:-0}

node_ip() {  # node_ip "$@": --node-ip-address from the flags, else the address Ray would pick here
  local a
  for a in "$@"; do
    case "$a" in --node-ip-address=*) echo "${a#*=}"; return 0 ;; esac
  done
  python -c 'import ray.util; print(ray.util.get_node_ip_address())' 2>/dev/null || hostname -I 2>/dev/null | awk '{print $1}'
}

export_gloo_interface() {  # export_gloo_interface IP: GLOO_SOCKET_IFNAME for the interface holding IP
  [ -n "${GLOO_SOCKET_IFNAME:-}" ] && return 0
  local ifname
  ifname=$(PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" python -c \
    'import sys; from elastic_train.train.netif import interface_of; print(interface_of(sys.argv[1]) or "")' "$1" \
    2>/dev/null) || ifname=""
  if [ -n "$ifname" ]; then export GLOO_SOCKET_IFNAME=$ifname; fi
}
