"""Ray Tune internals (checked on Ray 2.60.0)."""

from __future__ import annotations

from typing import Any


def trial_statuses(grid: Any) -> dict[str, str]:
    """Trial id -> Tune's status (``TERMINATED``, ``ERROR``, ``RUNNING``...) for a ``ResultGrid``.

    A ``Result`` does not say whether its trial was stopped by the scheduler or left running by an interrupted
    sweep; only the grid's private ``_experiment_analysis`` holds the trials (no public accessor in 2.60)."""
    return {t.trial_id: t.status for t in grid._experiment_analysis.trials}
