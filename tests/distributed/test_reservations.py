"""A Train controller that dies without its own end leaves its resource request in Ray's cluster-wide
AutoscalingCoordinator for 180 s (launch/reservations.py): the next fit, or a sweep's driver, cancels the request
of every recorded controller the GCS no longer holds alive, and only those."""

from __future__ import annotations

import time
import uuid

import ray

from elastic_train.compat.ray_core import kv_keys
from elastic_train.compat.ray_train import autoscaling_coordinator, train_run_requester
from elastic_train.launch.reservations import RUNS_NAMESPACE, record_train_run, release_dead_runs_requests


@ray.remote(num_cpus=0)
class _Controller:
    """Stands in for a Train controller: records itself as RecordTrainRun does at a controller's start."""

    def record(self, run_id: str) -> None:
        record_train_run(ray.get_runtime_context().get_actor_id(), run_id)


def _wait_until(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_only_a_dead_controllers_request_is_cancelled_and_its_record_dropped(ray_session):
    coordinator = autoscaling_coordinator()
    live, doomed = _Controller.remote(), _Controller.remote()
    live_run, dead_run = uuid.uuid4().hex, uuid.uuid4().hex
    ray.get([live.record.remote(live_run), doomed.record.remote(dead_run)], timeout=60)
    for run in (live_run, dead_run):
        ray.get(coordinator.request_resources.remote(requester_id=train_run_requester(run),
                                                     resources=[{"CPU": 0.25}], expire_after_s=180), timeout=30)

    def reserved(run: str) -> dict:
        return ray.get(coordinator.get_reserved_resources.remote(train_run_requester(run)), timeout=30)

    assert reserved(dead_run) and reserved(live_run)
    try:
        ray.kill(doomed)
        _wait_until(lambda: dead_run in release_dead_runs_requests(), "the killed controller's run was not released")
        _wait_until(lambda: not reserved(dead_run), "its request still holds a reservation")
        assert reserved(live_run)  # a live controller's request is left alone
        keys = [k.decode() for k in kv_keys(b"", RUNS_NAMESPACE, 10)]
        assert not any(dead_run in k for k in keys) and any(live_run in k for k in keys)
    finally:
        coordinator.cancel_request.remote(requester_id=train_run_requester(live_run))
        ray.kill(live)
        _wait_until(lambda: live_run in release_dead_runs_requests() or
                    not any(live_run in k.decode() for k in kv_keys(b"", RUNS_NAMESPACE, 10)),
                    "the second record was not dropped")
