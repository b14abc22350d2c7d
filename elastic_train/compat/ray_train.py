"""Ray Train internals (checked on Ray 2.60.0): callback bases, the elastic scaling policy and its autoscaling
coordinator, the train context, environment knobs and logger names.

Our subclasses override private methods of some of these; they live with their feature and are listed in
:mod:`.registry` with the signature each override expects (``launch/trainer.py``: ``_initialize_and_run_controller``;
``sweep/elastic.py``: the elastic policy and the coordinator client).
"""

from __future__ import annotations

from typing import Any

# Ray Train's worker-group callback that hands each worker its shards of the trainer's ``datasets`` through a
# DatasetManager actor (launch/controller.py: none is started when the trainer has no datasets).
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

# Ray Train's callback that starts a detached PlacementGroupCleaner per run (launch/controller.py: not in sweep
# trials, whose placement groups the sweep's driver reaps).
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

# Callback bases. Ray Train V2 exposes only ``UserCallback`` publicly; hooks on the controller (its start, a
# failure), on the worker group (its start and shutdown), on reports, and in a worker before the training
# function runs are only in this internal module (ray-project/ray: Train V2 callbacks, "DeveloperAPI" at most).
from ray.train.v2._internal.execution.callback import (
    ControllerCallback,
    ReportCallback,
    WorkerCallback,
    WorkerGroupCallback,
)

# The elastic policy and Ray Train's client of the cluster-wide AutoscalingCoordinator (sweep/elastic.py: a
# trial's floor and extra; the module's docstring says why stock Ray does not grow a trial).
from ray.train.v2._internal.execution.scaling_policy.autoscaling_coordinator_client import (
    AUTOSCALING_REQUESTS_EXPIRE_TIME_S,
    AUTOSCALING_REQUESTS_GET_TIMEOUT_S,
    TrainAutoscalingCoordinatorClient,
)
from ray.train.v2._internal.execution.scaling_policy.elastic import ElasticScalingPolicy

__all__ = [
    "AUTOSCALING_REQUESTS_EXPIRE_TIME_S", "AUTOSCALING_REQUESTS_GET_TIMEOUT_S", "HEALTH_CHECK_ENV",
    "PREEMPTION_WATCHER_ENV", "START_TIMEOUT_ENV", "STORAGE_LOGGER", "ControllerCallback", "DatasetsCallback",
    "ElasticScalingPolicy",
    "PlacementGroupCleanerCallback", "ReportCallback",
    "TrainAutoscalingCoordinatorClient", "WorkerCallback", "WorkerGroupCallback", "autoscaling_coordinator",
    "cancel_resource_requests",
    "build_train_resource_request", "resource_request_priority", "train_context_logger", "train_run_id",
    "train_run_requester",
]

# Environment knobs read by the Train controller (ray/train/v2/_internal/constants.py; no ScalingConfig or
# RunConfig field). A rename would be ignored silently: the canary compares them with Ray's constants.
HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # report() waits for this poll: 2 s by default
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # a restart after a node loss retries sooner
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # "0": no watcher process per worker group

# Tune's report in a trial logs "Checkpoint successfully created at: ..." at INFO on this logger (sweep/relay.py).
STORAGE_LOGGER = "ray.train._internal.storage"


def train_run_requester(run_id: str) -> str:
    """The AutoscalingCoordinator requester id under which a Train run's scaling policy asks for its workers (its
    controller cancels it at a graceful end; one ended by a kill leaves it for the coordinator's 180 s expiry)."""
    return f"train-{run_id}"


def autoscaling_coordinator() -> Any:
    """The cluster-wide AutoscalingCoordinator actor (Ray Data's, shared with Ray Train), created if absent."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
        get_or_create_autoscaling_coordinator,
    )

    return get_or_create_autoscaling_coordinator()


def cancel_resource_requests(requester_ids: list[str]) -> list[Any]:
    """Cancel the AutoscalingCoordinator's requests of ``requester_ids``; returns the calls' refs, for a caller
    that must know them done before another process asks (one caller's own calls to an actor run in order).
    Raises what reaching the coordinator raises; never creates it for nothing to cancel."""
    if not requester_ids:
        return []
    coordinator = autoscaling_coordinator()
    return [coordinator.cancel_request.remote(requester_id=requester_id) for requester_id in requester_ids]


def resource_request_priority() -> Any:
    """The coordinator's ``ResourceRequestPriority`` enum (HIGH for a trial's floor, MEDIUM for its growth)."""
    from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import ResourceRequestPriority

    return ResourceRequestPriority


def build_train_resource_request(scaling_config: Any, num_workers: int) -> Any:
    """Ray Train's (resources, label selectors) request for ``num_workers`` workers of ``scaling_config``."""
    from ray.train._internal.autoscaling_coordinator_client import build_train_resource_request as build

    return build(scaling_config, num_workers)


def train_run_id() -> str | None:
    """Ray Train's id of this run (one per controller), in a worker; None without it (a private API: without it a
    resumed driver may wait out the coordinator's expiry, launch/reservations.py)."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        return get_train_context().train_run_context.run_id
    except Exception:
        return None


def train_context_logger() -> str:
    """The name of the logger Ray Train's context module logs every report on: its file path, not its module."""
    from ray.train.v2._internal.execution import context as train_context

    return train_context.__file__
