"""Elastic trials: each trial starts at what fits and grows into the workers that stopped trials free.

Why stock Ray Train did not grow a trial (measured with Ray 2.60, ``bench/sweep_cost.py --elastic``): an
elastic Train run sizes its worker group from what the cluster-wide ``AutoscalingCoordinator`` actor reserves
for it (``ray/train/v2/_internal/execution/scaling_policy/elastic.py``). Every run asks for ``max_workers``
bundles; the coordinator hands out the cluster's *total* resources to its requesters, first come first
served. Tune's trial drivers are not requesters, so their CPUs count as free, and the first trial is reserved
``max_workers`` while later ones get what is left, maybe less than their minimum. So a trial started at its
maximum (its placement group then waited for CPUs that another trial's driver held) or not at all, and never
at its minimum with room to grow. And a trial that ASHA stopped died with its controller, which never
cancelled its request: its reservation stayed for the coordinator's 180 s expiry.

The fix, two kinds of requester on the same coordinator:

* a **floor** per live trial (``sweep-floor-<trial id>``, priority HIGH), registered and released by the
  sweep's driver (:class:`TrialFloors`, a Tune callback): the trial's driver CPUs plus its ``min_workers``
  workers. The sweep admits only as many trials as the cluster holds at their minimum (plan.check_concurrency),
  so every floor is reserved; a pending trial's floor comes before any growth.
* the trial's **extra** (``sweep-extra-<trial id>``, priority MEDIUM, :class:`TrialScalingPolicy`): its Train
  run asks for ``max - min`` more workers and sizes its group at ``min`` plus the extra reserved to it. A
  stopped trial's floor and extra are cancelled by the driver at once, so the coordinator re-reserves the
  freed workers to the surviving trials' extras (earliest trial first) and their next resize check grows them.

The engine keeps the global batch at every world size, so a trial's result does not depend on when it grew.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ray.tune import Callback

from elastic_train.compat.ray_train import (
    AUTOSCALING_REQUESTS_EXPIRE_TIME_S,
    AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
    ElasticScalingPolicy,
    TrainAutoscalingCoordinatorClient,
    autoscaling_coordinator,
    build_train_resource_request,
    cancel_resource_requests,
    resource_request_priority,
)

log = logging.getLogger(__name__)

FLOOR_PREFIX, EXTRA_PREFIX = "sweep-floor-", "sweep-extra-"
REFRESH_S = 20.0  # floors are re-sent this often (they expire after AUTOSCALING_REQUESTS_EXPIRE_TIME_S)
LIVE = ("PENDING", "RUNNING")  # a PAUSED trial (PBT) has no Train run: its floor comes back when it resumes


def _coordinator() -> Any:
    return autoscaling_coordinator()


class _ExtraClient(TrainAutoscalingCoordinatorClient):
    """Ray Train's coordinator client, asking at MEDIUM priority: a trial's growth comes after every floor."""

    def send_resource_request(self, scaling_config: Any, num_workers: int) -> None:
        import ray

        priority = resource_request_priority()
        resources, label_selectors = build_train_resource_request(scaling_config, num_workers)
        try:
            ray.get(self._autoscaling_coordinator.request_resources.remote(
                requester_id=self._requester_id, resources=resources, label_selectors=label_selectors,
                expire_after_s=AUTOSCALING_REQUESTS_EXPIRE_TIME_S, priority=priority.MEDIUM),
                timeout=AUTOSCALING_REQUESTS_GET_TIMEOUT_S)
            self._latest_autoscaling_request_time = time.monotonic()
        except Exception as e:  # the requests expire by themselves
            log.warning("could not send %s's resource request: %s", self._requester_id, e)


class TrialScalingPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy for a sweep trial: ``min_workers`` are the trial's floor (reserved by the sweep's
    driver), the run asks only for the ``max - min`` it may grow by, and its size is the floor plus what the
    coordinator reserves of that. Created in the trial's process, pickled into its Train controller."""

    def __init__(self, scaling_config: Any, trial_id: str):
        super().__init__(scaling_config)
        self.trial_id = trial_id

    def _get_num_workers_for_resource_request(self) -> int:
        return self.scaling_config.max_workers - self.scaling_config.min_workers

    def _count_possible_workers(self, reserved_resources: Any) -> int:
        extra = super()._count_possible_workers(reserved_resources) if reserved_resources else 0
        return min(self.scaling_config.min_workers + extra, self.scaling_config.max_workers)

    def after_controller_start(self, train_run_context: Any) -> None:
        self._requester_id = f"{EXTRA_PREFIX}{self.trial_id}"
        self._coordinator_client = _ExtraClient(self._requester_id)
        self._send_resource_request()


def floor_bundles(trial_cpus: float, worker: dict[str, float], min_workers: int) -> list[dict[str, float]]:
    """A trial's floor: its driver's CPUs, then one bundle per minimum worker."""
    return [{"CPU": trial_cpus}] + [dict(worker) for _ in range(min_workers)]


class TrialFloors(Callback):
    """Tune callback on the sweep's driver: a floor for every live trial; a trial that ends (finished, stopped by
    the scheduler, failed) has its floor and its Train run's extra cancelled at once. Best effort, never blocks
    the sweep: calls to the coordinator are not waited for (one caller's calls to an actor run in order)."""

    def __init__(self, floor_of: Any):
        self.floor_of = floor_of  # trial config (its overrides) -> floor bundles
        self._sent: dict[str, float] = {}  # trial id -> monotonic time its floor was last sent

    def _register(self, trial: Any) -> None:
        priority = resource_request_priority()
        try:
            _coordinator().request_resources.remote(
                requester_id=f"{FLOOR_PREFIX}{trial.trial_id}", resources=self.floor_of(trial.config),
                expire_after_s=AUTOSCALING_REQUESTS_EXPIRE_TIME_S, priority=priority.HIGH)
            self._sent[trial.trial_id] = time.monotonic()
        except Exception as e:  # the requests expire by themselves
            log.debug("floor of %s: %s", trial.trial_id, e)

    def release(self, trial_id: str) -> None:
        self._sent.pop(trial_id, None)
        try:
            cancel_resource_requests([f"{prefix}{trial_id}" for prefix in (FLOOR_PREFIX, EXTRA_PREFIX)])
        except Exception as e:  # the requests expire by themselves
            log.debug("release %s: %s", trial_id, e)

    def sync(self, trials: list[Any]) -> None:
        now = time.monotonic()
        for trial in trials:
            if trial.status in LIVE:
                if now - self._sent.get(trial.trial_id, float("-inf")) >= REFRESH_S:
                    self._register(trial)
            elif trial.trial_id in self._sent:
                self.release(trial.trial_id)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        self.sync(trials)

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if trial.trial_id not in self._sent:
            self._register(trial)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.release(trial.trial_id)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.release(trial.trial_id)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        for trial in trials:
            self.release(trial.trial_id)
