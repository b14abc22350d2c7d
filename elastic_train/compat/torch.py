"""torch internals (checked on torch 2.13.0)."""

from __future__ import annotations

from typing import Any


def preload_torch_export() -> None:
    """Import what ``torch.export.export`` imports on its first call (its private ``_trace``, which pulls in
    torch._dynamo: seconds on a small machine), so that it is paid while the run trains, not at its end when
    ``mlflow.pytorch.log_model`` saves in MLflow 3's default "pt2" format. A torch without it: nothing to do."""
    try:
        import torch.export._trace  # noqa: F401
    except ImportError:
        pass


def set_last_lr(scheduler: Any, lrs: list[float]) -> None:
    """Set what ``scheduler.get_last_lr()`` returns, after the learning rate was changed by hand (a PBT exploit).

    ``LRScheduler`` keeps its last computed rates in the private ``_last_lr`` and has no setter; without this,
    ``get_last_lr()`` (what the loop logs as ``lr``) returns the donor's rate until the next ``step()``."""
    scheduler._last_lr = list(lrs)
