"""Distributed evaluation of a trained model, the driver's side
(the workers' is ``train.worker.evaluate_loop_per_worker``).

The driver loads the model once (from a checkpoint or an MLflow model) and ships its weights and the data
through the object store; each worker rebuilds the module, evaluates its contiguous validation shard and
the sums are all-reduced, so the metrics are exactly those of the whole validation set whatever the
number of workers. Rank 0 hands them back through the run's ledger.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import ray
import torch

from elastic_train.config import ConfigError
from elastic_train.launch.context import RunContext
from elastic_train.train.evaluator import weights_of
from tracking import TrackingBackend, backend_for


def load_source(
    checkpoint: str | None, model_uri: str | None, backend: TrackingBackend
) -> tuple[torch.nn.Module, dict, dict]:
    """The model to evaluate and what it was trained with: ``(module, config dict, info)``.

    ``checkpoint`` may be a checkpoint folder (or URI) or a run folder (its latest checkpoint is used);
    ``model_uri`` a model logged in ``backend`` (``models:/NAME/VERSION``, ``runs:/RUN_ID/model``).
    """
    if checkpoint:
        return _from_checkpoint(checkpoint)
    try:
        model, metadata = backend.load_model(model_uri)
    except Exception as e:  # a wrong URI, a missing version, an unreachable server
        raise ConfigError(
            "--model", model_uri, f"cannot load it from {backend.uri} ({type(e).__name__}: {e})"
        ) from None
    recipe = metadata.get("elastic_train")
    if not recipe:
        raise ConfigError("--model", model_uri, "was not logged by elastic-train (no config in its metadata)")
    return model, recipe["config"], {"source": model_uri, "source_run_id": metadata.get("run_id"),
                                     "extra_files": metadata.get("extra_files") or {},
                                     "data_spec": recipe.get("data_spec")}


def _from_checkpoint(checkpoint: str) -> tuple[torch.nn.Module, dict, dict]:
    from ray.train import Checkpoint

    from elastic_train.launch.storage import RunStorage
    from elastic_train.train.state import IncompleteCheckpoint, load_model

    path = checkpoint.rstrip("/")
    if "://" not in path and not os.path.exists(path):
        raise ConfigError("--checkpoint", checkpoint, "no such file or folder")
    parent, _, name = path.rpartition("/")
    latest = RunStorage(parent or ".", name).latest_checkpoint() if not name.startswith("checkpoint_") else None
    if latest is not None:
        path = latest[0]
    try:
        with Checkpoint(path).as_directory() as d:
            model, cfg, meta = load_model(d)
    except IncompleteCheckpoint:
        raise ConfigError("--checkpoint", checkpoint, "not a complete checkpoint (no meta.json)") from None
    return model, cfg.model_dump(mode="json"), {"source": path, "source_run_id": meta.get("mlflow_run_id"),
                                                "source_metrics": meta.get("metrics", {})}


def run_evaluation(ctx: RunContext, model: torch.nn.Module) -> dict[str, Any]:
    """Evaluate on the cluster; returns the aggregated validation metrics."""
    from elastic_train.launch.fit import share_data
    from elastic_train.launch.trainer import build_evaluator, run_store
    from elastic_train.train.ledger import RunLedger

    ledger = RunLedger(uuid.uuid4().hex, run_store(ctx))
    evaluator = build_evaluator(
        ctx, weights_ref=ray.put(weights_of(model)), data_ref=share_data(ctx.bundle), ledger=ledger
    )
    evaluator.fit()
    try:
        metrics = ledger.get_final()
    finally:
        ledger.drop()
    if metrics is None:
        raise RuntimeError("evaluation finished without metrics")
    return metrics


def record_evaluation(ctx: RunContext, metrics: dict[str, Any], info: dict[str, Any]) -> None:
    """The evaluation's metrics and source into its tracking run, which then ends FINISHED."""
    spec = ctx.tracking
    if spec is None:
        return
    backend = backend_for(spec, ctx.home)
    writer = backend.writer(spec)
    writer.log_metrics({k: v for k, v in metrics.items() if isinstance(v, int | float)}, step=0)
    writer.set_tags({"source": info["source"], "source_run_id": info.get("source_run_id") or ""})
    writer.close()
    backend.end_run(spec, "FINISHED")
