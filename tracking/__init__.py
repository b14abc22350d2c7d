"""Experiment tracking: a small interface, an MLflow implementation, a no-op for non-zero ranks.

Only rank 0 and the driver talk to MLflow; every other rank gets :class:`NullTracker`, so training code
has no ``if rank == 0`` branches. Nothing here runs at import time.
"""

from __future__ import annotations

from tracking.base import NullTracker, Tracker, TrackingSpec


def tracker_for(spec: TrackingSpec | None, rank: int) -> Tracker:
    """The MLflow tracker on rank 0 when tracking is configured; a no-op everywhere else."""
    if spec is None or rank != 0:
        return NullTracker()
    from tracking.mlflow_tracker import MlflowTracker

    return MlflowTracker(spec)


__all__ = ["NullTracker", "Tracker", "TrackingSpec", "tracker_for"]
