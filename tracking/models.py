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
) -> dict[str, Any]:
    """Log the unwrapped module as the run's model; register a new version when ``register_as`` is set.

    ``metadata`` (the resolved job config and data spec) goes into the MLmodel file, so the model alone is
    enough to rebuild its evaluation (``jobs.evaluate --model models:/NAME/VERSION``).
    """
    import mlflow
    import mlflow.pytorch
    import torch
    from mlflow.models import infer_signature

    model = model.cpu().eval()
    signature = None
    if input_example is not None:
        with torch.no_grad():
            output = model(torch.as_tensor(input_example)).numpy()
        signature = infer_signature(input_example, output)
    info = _with_tracking_uri(uri, lambda: mlflow.pytorch.log_model(
        model,
        name="model",
        run_id=run_id,
        signature=signature,
        input_example=input_example,
        # Explicit requirements: inferring them imports the model in a subprocess (slow, fragile).
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}"],
        registered_model_name=register_as,
        metadata=metadata,
    ))
    out = {"model_uri": info.model_uri}
    if register_as and getattr(info, "registered_model_version", None) is not None:
        out["registered_model"] = f"models:/{register_as}/{info.registered_model_version}"
    return out


def load_logged_model(uri: str, tracking_uri: str) -> tuple[Any, dict[str, Any]]:
    """``(module, metadata)`` for a logged model URI (``models:/NAME/VERSION``, ``runs:/ID/model``, ...)."""
    import mlflow
    import mlflow.pytorch

    info, model = _with_tracking_uri(
        tracking_uri, lambda: (mlflow.models.get_model_info(uri), mlflow.pytorch.load_model(uri, map_location="cpu"))
    )
    return model, dict(info.metadata or {}) | {"run_id": info.run_id}
