"""Experiment tracking behind one interface: the only package that imports MLflow.

    base.py            Tracker (what a process logs), TrackingBackend (the driver's runs), TrackingSpec, NullTracker
    mlflow_backend.py  MLflow: runs, params, status, artifacts, models, registry, sweep children
    mlflow_tracker.py  MLflow logging with batching, retries and a spool; sender.py runs it in a child process
    fence.py           one sender per run at a time: a restarted run's waits for a dead worker's orphaned one
    checkpoints.py     a Ray Train callback copying checkpoints into the run
    relay.py           one MLflow sender actor a whole sweep's trials log through (instead of one child each)
    jsonl.py           a JSON-lines backend on a local folder (no server, no MLflow)
    quiet.py           MLflow's INFO logging off the console (WARNING and above still print)

``tracking.backend`` picks one (:func:`open_backend`); workers get the matching tracker from
:func:`tracker_for`. Only rank 0 and the driver log: every other rank gets a :class:`NullTracker`, so training
code has no ``if rank == 0`` branches. Nothing here runs at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracking.base import ChildRun, NullTracker, Tracker, TrackingBackend, TrackingSpec, TrackingUnavailable

BACKENDS = ("mlflow", "jsonl")


def open_backend(name: str, uri: str | None, home: Path) -> TrackingBackend:
    """The backend ``name`` on ``uri`` (None: its default under ``home``)."""
    if name == "jsonl":
        from tracking.jsonl import JsonlBackend

        return JsonlBackend(uri, home)
    if name == "mlflow":
        from tracking.mlflow_backend import MlflowBackend

        return MlflowBackend(uri, home)
    raise ValueError(f"unknown tracking backend {name!r}; known: {', '.join(BACKENDS)}")


def backend_for(spec: TrackingSpec, home: Path | None = None) -> TrackingBackend:
    """The backend that holds ``spec``'s run (its URI is absolute already)."""
    return open_backend(spec.backend, spec.uri, home or Path.cwd())


def tracker_for(spec: TrackingSpec | None, rank: int, relay: Any | None = None) -> Tracker:
    """Rank 0's tracker when tracking is configured; a no-op everywhere else. ``relay``: a sweep's
    :class:`~tracking.relay.TrackingRelay` (MLflow, without system metrics), instead of a sender child."""
    if spec is None or rank != 0:
        return NullTracker()
    if spec.backend == "jsonl":
        from tracking.jsonl import JsonlTracker

        return JsonlTracker(spec)
    if relay is not None and not spec.system_metrics:
        from tracking.relay import RelayTracker

        return RelayTracker(spec, relay)
    from tracking.sender import ProcessTracker  # MLflow, from a child process

    return ProcessTracker(spec)


__all__ = ["BACKENDS", "ChildRun", "NullTracker", "Tracker", "TrackingBackend", "TrackingSpec", "TrackingUnavailable",
           "backend_for", "open_backend", "tracker_for"]
