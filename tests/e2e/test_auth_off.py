"""The reverse of a token-auth head and a client without a token (issue 34 item 1): a client that sends a token
to a head with token auth off. ray.init connects, but the driver's own gRPC server then demands the token from
the cluster's processes, which send none, and its actors are cancelled (exit 1 with C++ lines, seen). The driver
asks the GCS once with and once without the token before ray.init, and exits 2 with one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import RAY, READY_TIMEOUT_S, ROOT, VENV_BIN, RayProcess, free_ports, node_ports

pytestmark = pytest.mark.e2e


def test_a_token_sent_to_a_head_without_auth_exits_2_with_one_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS"))}
    env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(home), RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="disabled")
    short = Path(tempfile.mkdtemp(prefix="et-", dir="/tmp"))
    taken: set[int] = set()
    gcs, dashboard = free_ports(2)
    taken |= {gcs, dashboard}
    head = RayProcess([RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1",
                       f"--port={gcs}", "--include-dashboard=false", f"--dashboard-port={dashboard}",
                       "--object-store-memory=100000000", f"--temp-dir={short}", *node_ports(taken),
                       f"--ray-client-server-port={free_ports(1, taken)[0]}"], env, tmp_path / "head.log")
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while subprocess.run([RAY, "health-check", f"--address=127.0.0.1:{gcs}"], env=env, capture_output=True,
                             timeout=60, check=False).returncode != 0:
            assert head.alive() and time.monotonic() < deadline, head.tail()
            time.sleep(0.5)
        client = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "a" * 64, "PYTHONPATH": str(ROOT),
                  "ELASTIC_TRAIN_HOME": str(tmp_path / "driver-home")}
        for job in ("jobs.train", "jobs.sweep"):
            out = subprocess.run([sys.executable, "-m", job, "--config", "configs/digits.yaml", "--address",
                                  f"127.0.0.1:{gcs}"], cwd=ROOT, env=client, capture_output=True, text=True,
                                 timeout=120)
            lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
            assert out.returncode == 2, lines
            assert "token authentication off" in lines[-1] and "unset RAY_AUTH_MODE" in lines[-1], lines
            assert not any("Traceback" in line or "core_worker" in line for line in lines), lines
    finally:
        head.stop()
        shutil.rmtree(short, ignore_errors=True)
