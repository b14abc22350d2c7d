"""Separate hosts, the longer cases (make test-long): the head's host cut off for 5 s, and who may talk to the
head: a wrong token from the laptop is refused, and the dashboard is not reachable from the worker hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cluster import sim as simulator
from tests.hosts.conftest import RAY, ROOT
from tests.hosts.test_hosts import _finished_once, two_host_run

pytestmark = [pytest.mark.hosts, pytest.mark.long, pytest.mark.soak, pytest.mark.timeout(900)]


def test_the_heads_host_cut_off_for_5_s_is_survived(sim):
    """Shorter than the health check's ~8 s, so no node is declared dead: the workers' process group (between
    the worker hosts) never noticed, the controller's polls waited, and the run ends FINISHED without a restart."""
    g, epochs = 32, 2
    job = two_host_run(sim, "hosts-d", epochs, g)
    simulator.partition(sim, 0)
    try:
        t_cut = time.monotonic()
        while time.monotonic() - t_cut < 5:
            time.sleep(0.25)
    finally:
        simulator.heal(sim, 0)
    assert job.wait(400) == 0, job.console()[-3000:]
    summary = _finished_once(job, epochs, g, wall_s=600)
    assert summary["restarts"] == 0 and summary["world_sizes"] == [2], summary
    assert len(simulator.alive_nodes(sim)) == 3  # nobody was declared dead


def _laptop_submit(sim, home, **env_extra: str) -> subprocess.CompletedProcess:
    """A stranger on the laptop: no token file in its HOME, only what ``env_extra`` gives."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_", "MLFLOW_"))}
    env.update({"RAY_ADDRESS": sim.dashboard_url, "HOME": str(home), **env_extra})
    return subprocess.run([RAY, "job", "submit", "--working-dir", str(ROOT), "--", "python", "-c", "print(1)"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_a_wrong_token_or_none_is_refused_from_the_laptop(sim, tmp_path):
    jobs_before = simulator._api(sim, "/api/jobs/")[1]
    for label, extra, words in [
        ("wrong token", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64}, ("403", "Forbidden")),
        ("no token", {}, ("401", "Unauthorized", "token authentication is enabled")),
    ]:
        out = _laptop_submit(sim, tmp_path, **extra)
        assert out.returncode != 0, (label, out)
        assert any(w in out.stdout + out.stderr for w in words), (label, out.stdout[-1500:], out.stderr[-1500:])
    assert simulator._api(sim, "/api/jobs/")[1] == jobs_before  # no job was created


def _port_from(sim, host_index: int, ip: str, port: int) -> str:
    """'open' or 'closed': a TCP connect to ``ip:port`` from inside host ``host_index``."""
    probe = ("import socket, sys\n"
             "try:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); print('open')\n"
             "except OSError:\n    print('closed')\n")
    host = sim.hosts[host_index]
    out = subprocess.run(simulator.in_host(host, [sys.executable, "-c", probe, ip, str(port)]),
                         env=simulator.host_env(sim, host), capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_the_dashboard_is_not_reachable_from_the_worker_hosts(sim):
    assert _port_from(sim, 1, sim.head.ip, 8265) == "closed"  # the dashboard: the head's loopback only
    assert _port_from(sim, 1, sim.head.ip, 6379) == "open"  # while the GCS, which every node needs, is
