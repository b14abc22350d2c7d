"""Ray Train internals: callback bases, the elastic scaling policy and its autoscaling coordinator, the train
context and environment knobs. Each serves a feature of :mod:`.features` (registry.py lists every name).

A base class that this Ray lacks is replaced by a stand-in (:func:`_base`), so our subclasses are still defined
and every module imports on every supported Ray; the feature that needs the class is off there
(:func:`~elastic_train.compat.features.enabled`), so nothing ever instantiates a subclass of a stand-in.
"""

from __future__ import annotations

import importlib
from typing import Any

from elastic_train.compat.features import note_entries

__all__ = [
    "AUTOSCALING_REQUESTS_EXPIRE_TIME_S", "AUTOSCALING_REQUESTS_GET_TIMEOUT_S", "HEALTH_CHECK_ENV",
    "PREEMPTION_WATCHER_ENV", "START_TIMEOUT_ENV", "ControllerCallback", "DatasetsCallback", "ElasticScalingPolicy",
    "PlacementGroupCleanerCallback", "TrainAutoscalingCoordinatorClient", "WorkerCallback",
    "WorkerGroupCallback",
    "autoscaling_coordinator", "build_train_resource_request", "cancel_resource_requests", "refresh_reservations",
    "resource_request_priority", "train_run_id", "train_run_requester",
]


def _base(target: str) -> Any:
    """The class ``module:Name``, or a stand-in named after it when this Ray has none (its feature is off)."""
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return type(f"Missing{name}", (), {"__doc__": f"{target} is not in this Ray: its feature is off"})


def _value(target: str, default: Any) -> Any:
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return default


_EXEC = "ray.train.v2._internal.execution"
_CLIENT_MODULE = f"{_EXEC}.scaling_policy.autoscaling_coordinator_client"
_COORD_MODULE = "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator"

# Callback bases. Ray Train V2 exposes only ``UserCallback`` publicly (after_report, after_exception); hooks on the
# controller, the worker group and a worker before the training function are in this internal module.
ControllerCallback = _base(f"{_EXEC}.callback:ControllerCallback")  # dead_run_requests, restart_markers
WorkerGroupCallback = _base(f"{_EXEC}.callback:WorkerGroupCallback")  # restart_markers
WorkerCallback = _base(f"{_EXEC}.callback:WorkerCallback")  # worker_warmup
# lean_callbacks: the default callbacks we replace or leave out (launch/controller.py)
DatasetsCallback = _base("ray.train.v2._internal.callbacks.datasets:DatasetsCallback")
PlacementGroupCleanerCallback = _base(
    "ray.train.v2._internal.callbacks.placement_group_callback:PlacementGroupCleanerCallback")
# elastic_trials: the elastic policy and Ray Train's client of the cluster-wide AutoscalingCoordinator
ElasticScalingPolicy = _base(f"{_EXEC}.scaling_policy.elastic:ElasticScalingPolicy")
TrainAutoscalingCoordinatorClient = _base(f"{_CLIENT_MODULE}:TrainAutoscalingCoordinatorClient")
AUTOSCALING_REQUESTS_EXPIRE_TIME_S = _value(f"{_CLIENT_MODULE}:AUTOSCALING_REQUESTS_EXPIRE_TIME_S", 180)
AUTOSCALING_REQUESTS_GET_TIMEOUT_S = _value(f"{_CLIENT_MODULE}:AUTOSCALING_REQUESTS_GET_TIMEOUT_S", 5)

# train_knobs / no_preemption_watcher: read by the Train controller (ray/train/v2/_internal/constants.py; no
# RunConfig field). A rename would be ignored silently: the canary compares them with Ray's constants.
HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"  # report() waits for this poll: 2 s by default
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"  # a restart after a node loss retries sooner
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"  # "0": no watcher process per worker group

COORDINATOR_NAME = "AutoscalingCoordinator"  # its actor's name and namespace (get_or_create_autoscaling_coordinator)


def train_run_requester(run_id: str) -> str:
    """The AutoscalingCoordinator requester id under which a Train run's scaling policy asks for its workers (its
    controller cancels it at a graceful end; one ended by a kill leaves it for the coordinator's 180 s expiry)."""
    return f"train-{run_id}"


def autoscaling_coordinator() -> Any:
    """The cluster-wide AutoscalingCoordinator actor (Ray Data's, shared with Ray Train), created if absent."""
    coordinator = importlib.import_module(_COORD_MODULE)
    note_entries("elastic_trials", "request_resources", "get_or_create_autoscaling_coordinator")
    return coordinator.get_or_create_autoscaling_coordinator()


def existing_coordinator() -> Any | None:
    """The AutoscalingCoordinator actor if one exists (never creates it)."""
    import ray

    try:
        return ray.get_actor(COORDINATOR_NAME, namespace=COORDINATOR_NAME)
    except ValueError:  # none: nothing reserved, nothing to refresh or cancel
        return None


def cancel_resource_requests(requester_ids: list[str]) -> list[Any]:
    """Cancel the AutoscalingCoordinator's requests of ``requester_ids``; returns the calls' refs, for a caller
    that must know them done before another process asks (one caller's own calls to an actor run in order).
    Raises what reaching the coordinator raises; never creates it."""
    coordinator = existing_coordinator() if requester_ids else None
    if coordinator is None:
        return []
    note_entries("dead_run_requests", "cancel_request", "#AutoscalingCoordinator", "#train-")
    return [coordinator.cancel_request.remote(requester_id=requester_id) for requester_id in requester_ids]


def refresh_reservations(timeout_s: float) -> None:
    """Ask the coordinator to recompute its reservations against the nodes alive now (its own ``recompute=True``
    path, which Ray uses before it pins nodes). Raises on a coordinator that does not answer in time."""
    import ray

    coordinator = existing_coordinator()
    if coordinator is not None:
        note_entries("fresh_cluster_view", "get_reserved_resources", "#AutoscalingCoordinator")
        ray.get(coordinator.get_reserved_resources.remote(requester_id="elastic-train-refresh", recompute=True),
                timeout=timeout_s)


def resource_request_priority() -> Any:
    """The coordinator's ``ResourceRequestPriority`` enum (HIGH for a trial's floor, MEDIUM for its growth)."""
    return importlib.import_module(_COORD_MODULE).ResourceRequestPriority


def build_train_resource_request(scaling_config: Any, num_workers: int) -> Any:
    """Ray Train's (resources, label selectors) request for ``num_workers`` workers of ``scaling_config``."""
    from ray.train._internal.autoscaling_coordinator_client import build_train_resource_request as build

    return build(scaling_config, num_workers)


def train_run_id() -> str:
    """Ray Train's id of this run (one per controller), in a worker. Raises where this Ray has none."""
    from ray.train.v2._internal.execution.context import get_train_context

    note_entries("dead_run_requests", "get_train_context", "#run_id")
    return get_train_context().train_run_context.run_id
