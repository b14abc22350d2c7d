"""MLflow behind :class:`~tracking.base.TrackingBackend`: the driver's runs, artifacts, models and sweep children.

Workers log through :func:`tracking.tracker_for` (a child process on rank 0, see ``tracking.sender``); this class
is what the driver, the sweep and ``jobs.evaluate`` use. MLflow is imported on use, never at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from elastic_train.compat.torch import preload_torch_export
from tracking.base import ChildRun, Tracker, TrackingSpec
from tracking.quiet import quiet_mlflow_logging
from tracking.runs import (
    RUN_NAME_TAG,
    check_reachable,
    end_run,
    environment_params,
    get_or_create_experiment,
    is_server,
    last_logged_step,
    resolve_uri,
    start_run,
)


class MlflowBackend:
    name = "mlflow"

    def __init__(self, uri: str | None, home: Path):
        quiet_mlflow_logging()  # before MLflow is imported: no INFO lines when it creates the sqlite store
        self.uri = resolve_uri(uri, home)
        self.home = home

    def check(self) -> None:
        check_reachable(self.uri)

    def prepare_store(self, experiment: str) -> None:
        """Import MLflow, create the store and the experiment, and import what logging the final model needs
        (a driver does this in a thread while Ray starts, so the run's teardown does not)."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.uri)
        get_or_create_experiment(client, experiment, self.home / "mlartifacts" if not is_server(self.uri) else None)
        # mlflow.pytorch.log_model saves with torch.export (MLflow 3's default "pt2" format), whose first use
        # imports torch._dynamo: seconds on a small machine, which would otherwise fall in the teardown
        import mlflow.pytorch  # noqa: F401
        preload_torch_export()

    def start_run(self, experiment: str, run_name: str, *, kind: str, spool_path: Path,
                  parent_run_id: str | None = None, system_metrics: bool = False,
                  log_every_steps: int = 10, storage: str | None = None) -> tuple[TrackingSpec, bool]:
        return start_run(self.uri, experiment, run_name, artifact_root=self.home / "mlartifacts",
                         spool_path=spool_path, kind=kind, parent_run_id=parent_run_id,
                         system_metrics=system_metrics, log_every_steps=log_every_steps, storage=storage)

    def writer(self, spec: TrackingSpec) -> Tracker:
        from tracking.mlflow_tracker import MlflowTracker

        return MlflowTracker(spec, start_system_metrics=False)

    def logged_params(self, spec: TrackingSpec) -> set[str]:
        return set(self._client().get_run(spec.run_id).data.params)

    def last_logged_step(self, spec: TrackingSpec) -> int:
        return last_logged_step(spec.uri, spec.run_id)

    def end_run(self, spec: TrackingSpec, status: str) -> None:
        end_run(spec.uri, spec.run_id, status)

    def log_artifacts(self, spec: TrackingSpec, local_dir: str | Path, artifact_path: str | None = None) -> None:
        self._client().log_artifacts(spec.run_id, str(local_dir), artifact_path=artifact_path)

    def log_model(self, spec: TrackingSpec, model: Any, input_example: Any, register_as: str | None,
                  metadata: dict[str, Any], extra_files: list[str] | None = None) -> dict[str, Any]:
        from tracking.models import log_final_model

        return log_final_model(spec.uri, spec.run_id, model, input_example, register_as, metadata, extra_files)

    def load_model(self, model_uri: str) -> tuple[Any, dict[str, Any]]:
        from tracking.models import load_logged_model

        return load_logged_model(model_uri, self.uri)

    def child_runs(self, parent: TrackingSpec) -> list[ChildRun]:
        runs = self._client().search_runs(
            [parent.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.run_id}'", max_results=5000)
        return [ChildRun(r.data.tags.get(RUN_NAME_TAG, ""), r.info.run_id, r.info.status) for r in runs]

    def checkpoint_copier(self, spec: TrackingSpec, policy: list[str], score: str, mode: str) -> Any | None:
        from tracking.checkpoints import CheckpointCopier

        return CheckpointCopier(spec, policy, score, mode)

    def environment_params(self) -> dict[str, str]:
        import mlflow

        return {**environment_params(), "env.mlflow": mlflow.__version__}

    def log_dataset(self, spec: TrackingSpec, info: dict[str, Any]) -> None:
        from tracking.datasets import log_dataset_input

        log_dataset_input(spec.uri, spec.run_id, info)

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.uri)


