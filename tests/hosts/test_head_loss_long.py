"""The head lost without GCS fault tolerance, and the head's host cut off past detection (make test-long), on this
folder's shared cluster (``conftest.sim``: no Redis, the GCS's tables in its memory).

Without fault tolerance a new head is a new cluster: the worker hosts' raylets cannot rejoin it as they are, they
exit and ``add-worker.sh --rejoin`` joins each again as a new node; the lost job is unknown to the new head; the
job submitted again still resumes by its run name from the bucket. A head cut off for longer than detection: the
head declares both worker hosts dead, the run (whose driver and controller live on the head) waits for them, and
they rejoin by themselves after the heal.
"""

from __future__ import annotations

import re
import time

import pytest

from cluster import sim as simulator
from tests.helpers.trace import read_trace
from tests.hosts.conftest import submit, wait_for
from tests.hosts.test_head_loss import STEPS_PER_EPOCH, _worker_nodes
from tests.hosts.test_hosts import (
    SPREAD,
    _checkpoint_attempts,
    _finished_once,
    first_checkpoint,
    full_speed,
    two_host_run,
)

pytestmark = [pytest.mark.hosts, pytest.mark.long, pytest.mark.timeout(900)]


@pytest.mark.soak
def test_the_heads_host_cut_off_past_detection_is_survived(sim):
    g, epochs = 32, 8
    job = two_host_run(sim, "hosts-g", epochs, g)
    before = _worker_nodes(sim)
    simulator.partition(sim, 0)
    t_cut = time.monotonic()
    try:
        while time.monotonic() - t_cut < 25:  # past the health check's ~10 s: the head declares both hosts dead
            time.sleep(0.5)
    finally:
        simulator.heal(sim, 0)
    t_heal = time.time()
    wait_for(lambda: len(_worker_nodes(sim)) == 2 and set(_worker_nodes(sim).values()).isdisjoint(before.values()),
             120, "both worker hosts rejoined as new nodes", job)
    rejoined_s = time.time() - t_heal
    wait_for(lambda: any(r["world_size"] == 2 and r["t"] > t_heal for r in read_trace(job.trace)), 240,
             "training on both hosts again", job)
    regrown_s = time.time() - t_heal
    full_speed(sim, job)
    assert job.wait(400) == 0, job.console()[-3000:]
    summary = _finished_once(job, epochs, g, wall_s=900)
    assert summary["restarts"] >= 1
    print(f"hosts-g: the head cut off 25 s; both worker hosts rejoined {rejoined_s:.1f} s and trained again "
          f"{regrown_s:.1f} s after the heal; restarts {summary['restarts']}")


def test_a_lost_head_without_gcs_fault_tolerance_ends_the_job_and_it_resumes_by_name(sim):
    g, epochs = 32, 2
    t0 = time.monotonic()
    job = two_host_run(sim, "hosts-h", epochs, g)
    first_checkpoint(sim, job)
    before = _worker_nodes(sim)
    assert simulator.kill(sim, 0) > 0
    t_kill = time.monotonic()
    job.wait(60)
    detected_s = time.monotonic() - t_kill
    first_console = job.console()
    simulator.restart_head(sim)
    head_back_s = time.monotonic() - t_kill
    lost = re.search(r"Job '(raysubmit_\w+)' submitted successfully", first_console).group(1)
    assert simulator._api(sim, f"/api/jobs/{lost}")[0] == 404  # a new cluster: the lost job is not known to it
    wait_for(lambda: len(_worker_nodes(sim)) == 2, 240, "both worker hosts joined the new head")
    workers_back_s = time.monotonic() - t_kill
    assert set(_worker_nodes(sim).values()).isdisjoint(before.values())  # new nodes: the old raylets exited
    last_complete = max(step for step, _ in _checkpoint_attempts(sim, "hosts-h"))
    full_speed(sim, job)
    t_resubmit = time.time()
    again = submit(sim, "hosts-h", *SPREAD, f"train.epochs={epochs}", f"train.global_batch_size={g}",
                   "checkpoint.every_steps=5")
    assert again.wait(400) == 0, again.console()[-3000:]
    _finished_once(again, epochs, g, wall_s=300)
    assert "(resuming)" in again.console()
    resumed = min((r for r in read_trace(again.trace) if r["t"] > t_resubmit), key=lambda r: r["t"])
    assert resumed["epoch"] * STEPS_PER_EPOCH + resumed["step"] == last_complete, (resumed, last_complete)
    print(f"hosts-h (no GCS fault tolerance): job client ended {detected_s:.1f} s after the kill, new head "
          f"{head_back_s:.1f} s, worker hosts rejoined {workers_back_s:.1f} s; whole test "
          f"{time.monotonic() - t0:.1f} s; first console's end: {first_console[-300:]!r}")
