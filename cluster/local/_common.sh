# Sourced by start-head.sh and add-worker.sh: the venv, the GPU count, and the token.
# shellcheck shell=bash

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# Use the project's venv when there is one: Ray starts job entrypoints (`python -m jobs.train`) and
# workers with the `python` found on the PATH of `ray start`, so every node must see the same venv.
if [ -x "$REPO/.venv/bin/ray" ]; then
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
