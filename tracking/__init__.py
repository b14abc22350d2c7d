"""Experiment tracking: a small interface, an MLflow implementation, a no-op for non-zero ranks.

Only rank 0 and the driver talk to MLflow; every other rank gets :class:`NullTracker`, so training code
has no ``if rank == 0`` branches. Nothing here runs at import time.
"""

from __future__ import annotations

from tracking.base import NullTracker, Tracker, TrackingSpec


def tracker_for(spec: TrackingSpec | None, rank: int) -> Tracker:
    """Rank 0's tracker when tracking is configured (MLflow, from a child process); a no-op everywhere else."""
    if spec is None or rank != 0:
        return NullTracker()
    from tracking.sender import ProcessTracker

    return ProcessTracker(spec)


__all__ = ["NullTracker", "Tracker", "TrackingSpec", "tracker_for"]
