"""The final model in MLflow: ``mlflow.pytorch.log_model`` with a signature and input example."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from tracking.mlflow_tracker import _with_tracking_uri

log = logging.getLogger(__name__)


def log_final_model(
    uri: str,
    run_id: str,
    model: Any,
    input_example: np.ndarray | None,
    register_as: str | None = None,
    metadata: dict[str, Any] | None = None,
    extra_files: list[str] | None = None,
) -> dict[str, Any]:
    """Log the unwrapped module as the run's model; register a new version when ``register_as`` is set.

    ``metadata`` (the resolved job config and data spec) goes into the MLmodel file, so the model alone is
    enough to rebuild its evaluation (``jobs.evaluate --model models:/NAME/VERSION``); ``extra_files`` (the
    tokenizer.json of a language model) are stored inside the model (``extra_files/NAME``), so generating from
    it needs nothing else.
    """
    import mlflow
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature
    from mlflow.tracking import MlflowClient

    model = model.cpu().eval()
    signature = None
    if input_example is not None:
        with torch.no_grad():
            output = model(torch.as_tensor(input_example)).numpy()
        signature = infer_signature(input_example, output)
    # MLflow 3 files the LoggedModel under the *active* experiment, not the run's: with none set that is the
    # default experiment "0", whose artifact root is ./mlruns of the cwd (a folder in the user's checkout).
    # Naming the run's experiment for the call keeps the model under the run's own artifact root (issue 34).
    experiment_id = MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id
    info = _with_tracking_uri(uri, lambda: _in_experiment(experiment_id, lambda: mlflow.pytorch.log_model(
        model,
        name="model",
        run_id=run_id,
        signature=signature,
        input_example=input_example,
        # Explicit requirements: inferring them imports the model in a subprocess (slow, fragile).
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
        registered_model_name=register_as,
        metadata=metadata,
        extra_files=extra_files or None,
    )))
    out = {"model_uri": info.model_uri}
    if register_as and getattr(info, "registered_model_version", None) is not None:
        out["registered_model"] = f"models:/{register_as}/{info.registered_model_version}"
    return out


def _in_experiment(experiment_id: str, fn: Any) -> Any:
    """Call ``fn`` with MLflow's documented ``MLFLOW_EXPERIMENT_ID`` set to ``experiment_id`` (the active
    experiment when none was set with ``mlflow.set_experiment``, which nothing here calls), then restore it."""
    import os

    before = os.environ.get("MLFLOW_EXPERIMENT_ID")
    os.environ["MLFLOW_EXPERIMENT_ID"] = experiment_id
    try:
        return fn()
    finally:
        if before is None:
            os.environ.pop("MLFLOW_EXPERIMENT_ID", None)
        else:
            os.environ["MLFLOW_EXPERIMENT_ID"] = before


def load_logged_model(uri: str, tracking_uri: str) -> tuple[Any, dict[str, Any]]:
    """``(module, metadata)`` for a logged model URI (``models:/NAME/VERSION``, ``runs:/ID/model``, ...);
    ``metadata["extra_files"]`` maps the name of each file logged with it to its text."""
    import os
    import tempfile
    from pathlib import Path

    import mlflow
    import mlflow.pytorch

    def load() -> tuple[Any, Any, dict[str, str]]:
        bar, was = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
        os.environ[bar] = "false"  # a download into dst_path draws a progress bar: quiet when healthy
        try:
            with tempfile.TemporaryDirectory() as tmp:  # one download: the weights and the extra files
                model = mlflow.pytorch.load_model(uri, dst_path=tmp, map_location="cpu")
                extra = {p.name: p.read_text() for p in sorted(Path(tmp).glob("**/extra_files/*")) if p.is_file()}
                return mlflow.models.get_model_info(uri), model, extra
        finally:
            if was is None:
                os.environ.pop(bar, None)
            else:
                os.environ[bar] = was

    info, model, extra = _with_tracking_uri(tracking_uri, load)
    return model, dict(info.metadata or {}) | {"run_id": info.run_id, "extra_files": extra}
