"""Ray Tune: two documented settings we give other defaults, and one internal (feature ``trial_reuse``)."""

from __future__ import annotations

import os
from typing import Any

# Tune's "new output engine" prints a banner at every sweep's start whatever the verbosity (ray/tune/tune.py calls
# experiment_started on its AIR reporter, which prints "Configuration for experiment", "View detailed results
# here" and a TensorBoard hint unconditionally). With it off, ``RunConfig(verbose=0)`` is silent (issue 34 item 6).
# A documented setting ("Ray AIR environment variables": RAY_AIR_NEW_OUTPUT=0 disables the new console output).
NEW_OUTPUT_ENV = "RAY_AIR_NEW_OUTPUT"


def quiet_tune_output() -> None:
    """Tune's start banner off in this (the sweep's driver) process, unless the user set the variable."""
    os.environ.setdefault(NEW_OUTPUT_ENV, "0")


# Tune hands an ended trial's actor to the next trial (``reuse_actors``): ``FunctionTrainable.reset_config`` first
# waits this long for the last trial's function to return (2 s by default) and fails the *next* trial when it has
# not (sweep/tuner.py, reuses_trial_processes). Documented: "Environment variables used by Ray Tune".
RESET_WAIT_ENV = "TUNE_FUNCTION_THREAD_TIMEOUT_S"


def allow_reset_wait(seconds: int) -> None:
    """In a trial's process: Tune waits up to ``seconds`` for this trial's function to return before it hands the
    process to the next trial (unless the user set the variable)."""
    os.environ.setdefault(RESET_WAIT_ENV, str(seconds))


def trial_stop_event() -> Any | None:
    """This Tune actor's running trial's stop event (a ``threading.Event``; None outside a trial): Tune sets it
    (``session.finish``) when it stops the trial or hands its actor to the next trial. A reset session gets a new
    one, so an event taken at a trial's start is that trial's. Feature ``trial_reuse`` (no public view of a
    trial's stop in Tune's function API)."""
    from ray.train._internal.session import get_session

    from elastic_train.compat.features import note_entries

    note_entries("trial_reuse", "get_session", "stop_event")
    return getattr(get_session(), "stop_event", None)
