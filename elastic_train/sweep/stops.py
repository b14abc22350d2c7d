"""A trial the scheduler stops ends its Ray Train run at once, so that Tune can hand its process to the next trial.

With ``reuse_actors`` (sweep/tuner.py, :func:`~elastic_train.sweep.tuner.reuses_trial_processes`) Tune does not
end a stopped trial's actor when another trial waits for its resources: it resets the actor for that trial, and
the reset first waits for the stopped trial's function to return. That function is inside ``TorchTrainer.fit``,
blocked on its Train controller, which nothing stops: Tune would wait, give up and fail the *next* trial.
:class:`StopWatch` watches the trial's stop event (set by Tune when it stops the trial or hands its actor on) and
ends the Train controller this process created, as the end of the process did before: its workers end with it
(they are its actors), its placement group and cleaner are reaped by the sweep's driver (placement_groups.py),
and ``fit`` returns. The trial then returns at once: no summary, no run status (the driver closes a stopped
trial's run, as before). A trial whose training had ended by then (ASHA stops a trial at ``max_t`` too, at its
last report) goes on to its summary as usual: Tune waits for it (:data:`RESET_WAIT_S`).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

RESET_WAIT_S = 60  # Tune's wait for a stopped trial's function before it gives its process to the next trial


class StopWatch:
    """``with StopWatch() as stop: fit(...)``; ``stop.fired`` is set when Tune stopped the trial meanwhile."""

    POLL_S = 0.2

    def __init__(self, elastic: bool = False) -> None:
        self.elastic = elastic  # the trial's Train run reserved its workers with the coordinator: released at once
        self.fired = threading.Event()
        self._done = threading.Event()

    def __enter__(self) -> StopWatch:
        from elastic_train.compat import features
        from elastic_train.compat.ray_tune import allow_reset_wait, trial_stop_event

        if not features.enabled("trial_reuse"):  # Tune ends a stopped trial's process: its Train run with it
            return self
        event = trial_stop_event()
        if event is not None:
            allow_reset_wait(RESET_WAIT_S)
            threading.Thread(target=self._watch, args=(event,), name="elastic-train-trial-stop", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()

    def _watch(self, event: Any) -> None:
        while not self._done.is_set():
            if event.wait(self.POLL_S):
                self.fired.set()
                self._end_train_run()
                return

    def _end_train_run(self) -> None:
        from elastic_train.launch.trainer import RUNNING_TRAIN_RUNS
        from elastic_train.sweep.placement_groups import kill_via_gcs, own_train_controllers

        runs = list(RUNNING_TRAIN_RUNS)
        try:
            kill_via_gcs(own_train_controllers())
        except Exception as e:  # the process then ends as it did before reuse: Tune fails to reset it
            log.warning("could not end a stopped trial's Train run: %s", e)
        if self.elastic:
            cancel_resource_requests(runs)


def cancel_resource_requests(run_ids: list[str]) -> None:
    """Cancel what the killed Train runs ``run_ids`` asked the cluster-wide AutoscalingCoordinator for. A killed
    controller never cancels it, and the coordinator keeps a reservation 180 s: an elastic run started meanwhile
    (a later trial, the next sweep, a job on the same cluster) could not grow into those workers. Best effort;
    feature ``dead_run_requests``."""
    from elastic_train.compat import features
    from elastic_train.compat.ray_train import cancel_resource_requests as cancel
    from elastic_train.compat.ray_train import train_run_requester

    if not run_ids or not features.enabled("dead_run_requests"):
        return
    try:
        cancel([train_run_requester(run_id) for run_id in run_ids])
    except Exception as e:  # the requests expire by themselves
        log.debug("resource requests of %s not cancelled: %s", run_ids, e)
