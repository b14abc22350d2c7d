"""The tracking interface the engine talks to, and the no-op used on non-zero ranks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class TrackingSpec:
    """Everything a process needs to log into an existing run; resolved on the driver, picklable."""

    uri: str
    run_id: str
    experiment_id: str
    spool_path: str  # where metrics that could not be sent by the end are written (JSONL)
    system_metrics: bool = False
    log_every_steps: int = 10
    env: dict[str, str] = field(default_factory=dict)  # MLFLOW_TRACKING_USERNAME/PASSWORD etc. for workers
    backend: str = "mlflow"  # which TrackingBackend wrote the run (tracking.backend): workers build the same
    attempt: int | None = None  # the worker group's attempt (elastic_train/train/fence.py): the sender's fence


class TrackingUnavailable(RuntimeError):
    """The tracking store cannot be reached or refuses us."""


@dataclass(frozen=True)
class ChildRun:
    """A sweep trial's run under its parent."""

    name: str
    run_id: str
    status: str  # RUNNING | FINISHED | FAILED | KILLED


class Tracker(Protocol):
    """What the training code may ask of experiment tracking."""

    def skip_logged_steps(self, fallback: int) -> None:
        """From now on drop metrics logged ``unless_logged`` at steps the run already holds: a restarted run
        recomputes steps its previous attempt logged. The run's last step is asked of the store (the highest
        ``train_loss`` step): MLflow's sender asks once no orphaned sender of the run can deliver more (see
        tracking/fence.py) and the server answers; ``fallback`` (the highest step handed to tracking before)
        serves only a store that cannot say (the JSON-lines backend's unreadable file)."""
        ...

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int, *, unless_logged: bool = False) -> None: ...

    def set_tags(self, tags: dict[str, Any]) -> None: ...

    def log_checkpoint(self, path: str, artifact_path: str) -> None: ...

    def log_model(self, model: Any, **kwargs: Any) -> Any: ...

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]: ...


class TrackingBackend(Protocol):
    """The driver's side of tracking: runs, their lifecycle, artifacts and models. One per tracking store.

    The engine names no tracking library: it calls these methods (and :class:`Tracker` for params, metrics and
    tags), so a new backend is one class in ``tracking/`` and one ``tracking.backend`` literal.
    """

    name: str
    uri: str  # the resolved store (absolute): a URI that workers in other directories can use as is

    def check(self) -> None:
        """Raise TrackingUnavailable unless the store answers (and accepts our credentials)."""
        ...

    def start_run(self, experiment: str, run_name: str, *, kind: str, spool_path: Path,
                  parent_run_id: str | None = None, system_metrics: bool = False,
                  log_every_steps: int = 10, storage: str | None = None) -> tuple[TrackingSpec, bool]:
        """Find the run named ``run_name`` (under ``parent_run_id``) whose checkpoints are in ``storage`` (any
        when None), or create it: ``(spec, resumed)``."""
        ...

    def writer(self, spec: TrackingSpec) -> Tracker:
        """A driver-side tracker for ``spec``: params, metrics, tags; ``close()`` flushes it."""
        ...

    def logged_params(self, spec: TrackingSpec) -> set[str]:
        """Params the run holds already (they are immutable: a resume logs only new ones)."""
        ...

    def last_logged_step(self, spec: TrackingSpec) -> int:
        """The run's highest training step with metrics; -1 when none."""
        ...

    def end_run(self, spec: TrackingSpec, status: str) -> None: ...

    def log_artifacts(self, spec: TrackingSpec, local_dir: str | Path, artifact_path: str | None = None) -> None: ...

    def log_model(self, spec: TrackingSpec, model: Any, input_example: Any, register_as: str | None,
                  metadata: dict[str, Any], extra_files: list[str] | None = None) -> dict[str, Any]:
        """Log the final model, with ``extra_files`` (e.g. its tokenizer.json) inside it;
        ``{"model_uri": ..., "registered_model": ...}``."""
        ...

    def load_model(self, model_uri: str) -> tuple[Any, dict[str, Any]]:
        """``(module, metadata)`` of a logged model; ``metadata["extra_files"]``: ``{name: text}`` of the files
        logged with it."""
        ...

    def child_runs(self, parent: TrackingSpec) -> list[ChildRun]: ...

    def checkpoint_copier(self, spec: TrackingSpec, policy: list[str], score: str, mode: str) -> Any | None:
        """What copies the run's persisted checkpoints into it, on the driver (``offer(checkpoint, metrics)``,
        ``finish(timeout_s) -> {"sent", "unsent"}``: tracking/checkpoints.py), or None when the backend keeps
        none."""
        ...

    def environment_params(self) -> dict[str, str]:
        """Versions, git commit, Ray job id: what produced a run."""
        ...

    def log_dataset(self, spec: TrackingSpec, info: dict[str, Any]) -> None:
        """Record the run's data source (``SourceInfo`` fields: name, uri, digest, schema, num_rows, profile)."""
        ...


class NullTracker:
    """The tracker of every rank but 0 (and of runs with tracking off): accepts everything, does nothing."""

    def skip_logged_steps(self, fallback: int) -> None:
        pass

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int, *, unless_logged: bool = False) -> None:
        pass

    def set_tags(self, tags: dict[str, Any]) -> None:
        pass

    def log_checkpoint(self, path: str, artifact_path: str) -> None:
        pass

    def log_model(self, model: Any, **kwargs: Any) -> Any:
        return None

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        return {"unsent": 0, "spool_path": None}


class ForwardingTracker:
    """The Tracker interface as ``(command, args)`` messages for a sender elsewhere: rank 0's sender child
    (tracking/sender.py) or a sweep's relay actor (tracking/relay.py). Subclasses deliver them (``_send``);
    the receiving side runs them on its MlflowTracker with :func:`apply_call`."""

    def _send(self, cmd: str, *args: Any) -> None:
        raise NotImplementedError

    def skip_logged_steps(self, fallback: int) -> None:
        self._send("skip_logged_steps", int(fallback))

    def log_params(self, params: dict[str, Any]) -> None:
        self._send("log_params", params)

    def log_metrics(self, metrics: dict[str, float], step: int, *, unless_logged: bool = False) -> None:
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        self._send("log_metrics", numbers, int(step), int(time.time() * 1000), unless_logged)

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._send("set_tags", {k: str(v) for k, v in tags.items()})

    def log_checkpoint(self, path: str, artifact_path: str) -> None:
        self._send("log_checkpoint", str(path), artifact_path)

    def log_model(self, model: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the final model is logged by the driver")


def apply_call(tracker: Any, cmd: str, args: list[Any]) -> None:
    """Run one :class:`ForwardingTracker` message on the sender's tracker (log_metrics keeps its timestamp)."""
    if cmd == "log_metrics":
        metrics, step, ts, unless_logged = args
        tracker.log_metrics(metrics, step, timestamp_ms=ts, unless_logged=unless_logged)
    else:
        getattr(tracker, cmd)(*args)
