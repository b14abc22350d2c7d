"""Separate hosts: a ``cluster.sim`` cluster (network namespaces on a bridge, own /tmp) shared by this folder's
tests, and the laptop's side of a job: ``ray job submit`` from the root namespace to the head's dashboard.

Skipped, with the reason printed, where namespaces cannot be made (not root, no iproute2, no permission).
Every process the harness started is ended by ``down`` at the end, also when a test fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster import sim as simulator

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
BRIDGE = "ettest0"


@pytest.fixture(scope="module")
def sim() -> Iterator[simulator.Sim]:
    why = simulator.namespaces_supported()
    if why is not None:
        pytest.skip(f"separate hosts need network namespaces: {why}")
    hidden = simulator.invisible_in_hosts(state=simulator.default_state(BRIDGE))
    if hidden is not None:  # a checkout or venv under /tmp: every host test would fail in start-head.sh
        pytest.skip(f"separate hosts cannot run here: {hidden}")
    simulator.down(bridge=BRIDGE, say=lambda *_: None)  # what a killed earlier run left
    cluster = simulator.up(3, bridge=BRIDGE, subnet="198.18.9", say=lambda *_: None)
    try:
        yield cluster
    finally:
        simulator.down(cluster, say=lambda *_: None)


@dataclass
class Job:
    """One ``ray job submit`` running from the laptop; its console in ``log``, its summary in ``summary_path``."""

    name: str
    proc: subprocess.Popen
    log: Path
    summary_path: Path
    trace: Path

    def console(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"job {self.name} still running after {timeout_s:g} s:\n{self.console()[-3000:]}")

    def summary(self) -> dict:
        return json.loads(self.summary_path.read_text())


def submit(cluster: simulator.Sim, name: str, *overrides: str, env_vars: dict[str, str] | None = None) -> Job:
    """``ray job submit --working-dir . -- python -m jobs.train ...`` from the laptop, as docs/clusters.md shows.
    The trace and summary go to the harness's state folder: a path every host sees, like an NFS mount."""
    shared = Path(cluster.state) / "jobs" / name
    shared.mkdir(parents=True, exist_ok=True)
    trace, summary = shared / "trace", shared / "summary.json"
    runtime_env = {"env_vars": {**cluster.job_env(), **(env_vars or {})}}
    argv = [RAY, "job", "submit", "--working-dir", str(ROOT), "--runtime-env-json", json.dumps(runtime_env), "--",
            "python", "-m", "jobs.train", "--config", "configs/digits.yaml", "--summary-json", str(summary),
            f"name={name}", f"tracking.uri={cluster.mlflow_uri}", "tracking.log_every_steps=1",
            "tracking.system_metrics=false", f"data.trace_path={trace}", *overrides]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_", "MLFLOW_"))}
    env.update({k: v for k, v in cluster.laptop_env().items() if k.startswith("RAY_")})
    log = shared / "console.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    return Job(name, proc, log, summary, trace)


def wait_for(ready, timeout_s: float, what: str, job: Job | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if job is not None and job.proc.poll() is not None:
            pytest.fail(f"job {job.name} ended (rc {job.proc.returncode}) before {what}:\n{job.console()[-3000:]}")
        if time.monotonic() > deadline:
            tail = job.console()[-3000:] if job else ""
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}\n{tail}")
        time.sleep(0.5)


# What a lost or cut-off host made Ray print (issue 51, item 9): the raylet's and the GCS's C++ log lines
# ("file.cc:123:"), a raylet's "[state-dump]" tail and "Raylet is terminated" block, the driver's lost-object
# notices. The project's own lines say what happened instead; the job's console holds none of these.
RAY_CHATTER = re.compile(
    r"\b\w+\.cc:\d+:|\[state-dump\]|Raylet is terminated|has been marked dead because the detector"
    r"|Attempting to recover \d+ lost objects|Failed to remove \d+ bundle|StackTrace Information"
)


def ray_chatter(console: str) -> list[str]:
    """The console's lines that are Ray's own lost-host chatter (:data:`RAY_CHATTER`)."""
    return [line for line in console.splitlines() if RAY_CHATTER.search(line)]
