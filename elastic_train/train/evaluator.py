"""Validation on every worker's shard, summed over workers: exactly the whole set's metrics at any world size.

Used by the training session at each checkpoint and, for a model trained earlier, by the evaluation job's
workers (:func:`evaluate_weights`; the Ray side is ``worker.evaluate_loop_per_worker``). No Ray, no MLflow.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_train.data import DataSpec
from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import worker_data
from elastic_train.data.spec import eval_batch_size
from elastic_train.models import build_model
from elastic_train.train.loop import Batch, Precision, evaluate
from elastic_train.train.metrics import eval_metrics

if TYPE_CHECKING:  # pydantic-free at run time
    from elastic_train.config import JobConfig


def validate(
    model: nn.Module, batches: Iterable[Batch], precision: Precision, device: torch.device, world: int, spec: DataSpec
) -> tuple[dict[str, float], float]:
    """``(val_* metrics, samples)`` of the whole validation set: this worker's sums, all-reduced over ``world``."""
    totals = evaluate(model, batches, precision, device)
    if world > 1:
        dist.all_reduce(totals)
    loss_sum, correct, n = totals.tolist()
    return eval_metrics(loss_sum, correct, n, spec), n


def evaluate_weights(
    cfg: JobConfig, bundle: Any, weights: dict[str, torch.Tensor], rank: int, world: int, device: torch.device
) -> dict[str, Any]:
    """Rebuild ``cfg``'s model with ``weights`` and score it on this worker's shard (a collective over ``world``)."""
    model = build_model(cfg, bundle.spec)
    model.load_state_dict(weights)
    model.to(device)
    plan = BatchPlan(max(cfg.train.global_batch_size, world), world)
    data = worker_data(bundle, plan, rank, cfg.seed, device, loader_workers=0)
    batches = data.val_batches(eval_batch_size(bundle.spec))
    metrics, n = validate(model, batches, Precision.create(cfg.train.precision, device), device, world, bundle.spec)
    return metrics | {"val_samples": int(n), "world_size": world}


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    """A model's weights on the CPU, detached: what the driver ships to the evaluation workers."""
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}
