"""Ray Tune internals (checked on Ray 2.60.0)."""

from __future__ import annotations

import os
from typing import Any

# Tune's "new output engine" prints a banner at every sweep's start whatever the verbosity (ray/tune/tune.py calls
# experiment_started on its AIR reporter, which prints "Configuration for experiment", "View detailed results
# here" and a TensorBoard hint unconditionally). With it off, ``RunConfig(verbose=0)`` is silent (issue 34 item 6).
NEW_OUTPUT_ENV = "RAY_AIR_NEW_OUTPUT"


def quiet_tune_output() -> None:
    """Tune's start banner off in this (the sweep's driver) process, unless the user set the variable."""
    os.environ.setdefault(NEW_OUTPUT_ENV, "0")


def trial_statuses(grid: Any) -> dict[str, str]:
    """Trial id -> Tune's status (``TERMINATED``, ``ERROR``, ``RUNNING``...) for a ``ResultGrid``.

    A ``Result`` does not say whether its trial was stopped by the scheduler or left running by an interrupted
    sweep; only the grid's private ``_experiment_analysis`` holds the trials (no public accessor in 2.60)."""
    return {t.trial_id: t.status for t in grid._experiment_analysis.trials}


# Tune hands an ended trial's actor to the next trial (``reuse_actors``): ``FunctionTrainable.reset_config`` first
# waits this long for the last trial's function to return (2 s by default, read under this literal name) and fails
# the *next* trial when it has not (sweep/tuner.py, reuses_trial_processes).
RESET_WAIT_ENV = "TUNE_FUNCTION_THREAD_TIMEOUT_S"


def allow_reset_wait(seconds: int) -> None:
    """In a trial's process: Tune waits up to ``seconds`` for this trial's function to return before it hands the
    process to the next trial (unless the user set the variable)."""
    os.environ.setdefault(RESET_WAIT_ENV, str(seconds))


def trial_stop_event() -> Any | None:
    """This Tune actor's running trial's stop event (a ``threading.Event``; None outside a trial): Tune sets it
    (``session.finish``) when it stops the trial or hands its actor to the next trial. A reset session gets a new
    one, so an event taken at a trial's start is that trial's."""
    from ray.train._internal.session import get_session

    return getattr(get_session(), "stop_event", None)
