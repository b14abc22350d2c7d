"""torch: a warm-up through the public torch.export, and one internal (feature ``pbt_last_lr``)."""

from __future__ import annotations

from typing import Any


def preload_torch_export() -> None:
    """Run ``torch.export.export`` once on a one-layer module, so that what its first call imports
    (torch._dynamo: seconds on a small machine) is paid while the run trains, not at its end when
    ``mlflow.pytorch.log_model`` saves in MLflow 3's default "pt2" format. Public API; best effort."""
    import logging

    import torch

    try:
        torch.export.export(torch.nn.Linear(1, 1), (torch.zeros(1, 1),))
    except Exception as e:  # the real export at the run's end reports its own errors
        logging.getLogger(__name__).debug("torch.export warm-up skipped: %s", e)


def set_last_lr(scheduler: Any, lrs: list[float]) -> None:
    """Set what ``scheduler.get_last_lr()`` returns, after the learning rate was changed by hand (a PBT exploit).

    ``LRScheduler`` keeps its last computed rates in the private ``_last_lr`` and has no setter; without this,
    ``get_last_lr()`` (what the loop logs as ``lr``) returns the donor's rate until the next ``step()``."""
    from elastic_train.compat.features import note

    note("pbt_last_lr")
    scheduler._last_lr = list(lrs)
