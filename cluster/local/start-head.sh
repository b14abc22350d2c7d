#!/usr/bin/env bash
# Start a Ray head on this machine with all its GPUs, token auth on, the dashboard on 127.0.0.1 only.
#
#   cluster/local/start-head.sh [extra `ray start` flags, e.g. --num-cpus=16 --block]
#
# Environment: NUM_GPUS (default: counted), RAY_PORT (6379), RAY_DASHBOARD_PORT (8265),
# RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH (default token file ~/.ray/auth_token, generated if missing),
# RAY_REDIS_ADDRESS=HOST:PORT and RAY_REDIS_PASSWORD: GCS fault tolerance (below; docs/clusters.md "Head loss").
# It prints the exact `ray job submit` line to use. With --block it prints first and then runs Ray in the
# foreground (Ctrl-C stops it); otherwise Ray starts in the background: cluster/local/stop.sh stops it.
set -euo pipefail
# shellcheck source=cluster/local/_common.sh
source "$(dirname "$0")/_common.sh"

PORT=${RAY_PORT:-6379}
DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
GPUS=$(count_gpus)

# How fast a silent node (a lost host, a cut link) is declared dead: the GCS health-checks every raylet; a
# check fails after TIMEOUT, the next one starts PERIOD after that, and THRESHOLD failures in a row make the node
# dead: THRESHOLD x (PERIOD + TIMEOUT) of silence. Ray's defaults (3000 ms, 10000 ms, 5) take 65 s. Ours (1000 ms,
# 1000 ms, 5): dead after 9-10 s, and a blip shorter than 8 s (a switch reboot, a head briefly cut off) is
# survived. Read by the GCS at `ray start --head` (Ray's system config as RAY_<name>); set them in the
# environment to override. docs/clusters.md has the table; tests/unit/test_cluster_scripts.py checks the sum.
export RAY_health_check_period_ms=${RAY_health_check_period_ms:-1000}
export RAY_health_check_timeout_ms=${RAY_health_check_timeout_ms:-1000}
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-5}

if ! has_token; then
  if [ -n "${RAY_AUTH_TOKEN_PATH:-}" ]; then
    echo "error: RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH does not exist; unset it to generate ~/.ray/auth_token" >&2
    exit 2
  fi
  ray get-auth-token --generate >/dev/null 2>&1  # prints the token; keep it off the terminal
  echo "generated a new token"
fi
if [ -z "${RAY_AUTH_TOKEN:-}" ]; then
  chmod 700 "$(dirname "$TOKEN_FILE")" 2>/dev/null || true
  chmod 600 "$TOKEN_FILE"
fi
# GCS fault tolerance. RAY_REDIS_ADDRESS (Ray's own variable, read by `ray start --head`) keeps the GCS's tables
# in that Redis: worker nodes then wait for a new head (each for RAY_gcs_rpc_server_reconnect_timeout_s, 60 s by
# default) instead of exiting, and a head started again on the same address with the same Redis (and the same
# RAY_external_storage_namespace) takes the cluster back. RAY_REDIS_PASSWORD (or --redis-password=...) is its
# password. Checked before Ray starts: a Redis that does not answer, or refuses the password, exits 2 with one
# line within seconds (Ray 2.60 itself, measured: an address that refuses fails after 61 s, a wrong password after
# 1 s, each with ~100-200 lines ending in a C++ stack trace).
GCS_FT="off (the cluster dies with its head)"
REDIS_FLAGS=()
for a in "$@"; do
  case "$a" in --redis-password=*) export RAY_REDIS_PASSWORD="${a#--redis-password=}" ;; esac
done
if [ -n "${RAY_REDIS_ADDRESS:-}" ]; then
  python "$REPO/cluster/local/_redis_check.py" "$RAY_REDIS_ADDRESS" || exit 2
  if [ -n "${RAY_REDIS_PASSWORD:-}" ] && ! has_flag "--redis-password=${RAY_REDIS_PASSWORD}" "$@"; then
    REDIS_FLAGS=(--redis-password="$RAY_REDIS_PASSWORD")
  fi
  GCS_FT="on (Redis ${RAY_REDIS_ADDRESS}, namespace ${RAY_external_storage_namespace:-default})"
fi
HEAD_IP=$(node_ip "$@")
export_gloo_interface "$HEAD_IP"
WORKERS=$(( GPUS > 0 ? GPUS : 2 ))

print_next_steps() {
  cat <<MSG
------------------------------------------------------------------------------------------------
Ray head: ${GPUS} GPU(s), GCS on ${HEAD_IP}:${PORT}, dashboard http://127.0.0.1:${DASHBOARD_PORT} (this machine only)
Token:    $(describe_token)  (token auth on: RAY_AUTH_MODE=token)
GCS fault tolerance: ${GCS_FT}

Submit from this machine, in the repository:
  export RAY_AUTH_MODE=token RAY_API_SERVER_ADDRESS=http://127.0.0.1:${DASHBOARD_PORT}
  ray job submit --working-dir . -- python -m jobs.train --config configs/digits.yaml scaling.num_workers=${WORKERS}

Submit from your laptop: ssh -N -L ${DASHBOARD_PORT}:127.0.0.1:${DASHBOARD_PORT} ${HEAD_IP}, copy the token
to ~/.ray/auth_token there, and use the same two lines.

Add a machine (same code and venv paths there), after copying the token to it:
  ssh OTHER 'mkdir -m 700 -p ~/.ray' && scp -p ${TOKEN_FILE} OTHER:.ray/auth_token
  cluster/local/add-worker.sh ${HEAD_IP}:${PORT}      # run on OTHER, in the repository
Several machines need shared storage: checkpoint.storage_path=/mnt/nfs/... or s3://... / gs://...
Stop: cluster/local/stop.sh
------------------------------------------------------------------------------------------------
MSG
}

args=(--head --port="$PORT" --num-gpus="$GPUS"
      --include-dashboard=true --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT"
      --disable-usage-stats "${REDIS_FLAGS[@]}" "$@")
if has_flag --block "$@"; then
  print_next_steps
  exec ray start "${args[@]}"
fi
ray start "${args[@]}"
print_next_steps
