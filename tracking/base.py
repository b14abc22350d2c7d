"""The tracking interface the engine talks to, and the no-op used on non-zero ranks."""

from __future__ import annotations

from dataclasses import dataclass, field
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


class Tracker(Protocol):
    """What the training code may ask of experiment tracking."""

    def skip_logged_steps(self, fallback: int) -> None:
        """From now on drop metrics logged ``unless_logged`` at steps the run already holds: a restarted run
        recomputes steps its previous attempt logged. The run's last step is asked of MLflow (the highest
        ``train_loss`` step); ``fallback`` (the highest step handed to tracking before) when it cannot say."""
        ...

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int, *, unless_logged: bool = False) -> None: ...

    def set_tags(self, tags: dict[str, Any]) -> None: ...

    def log_checkpoint(self, path: str, artifact_path: str) -> None: ...

    def log_model(self, model: Any, **kwargs: Any) -> Any: ...

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]: ...


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
