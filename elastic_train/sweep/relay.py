"""Give Tune each trial's checkpoints, for population-based training.

Ray's ``TuneReportCallback`` passes a trial's reports on to Tune as metrics only (with a ``checkpoint_path``
metric): Tune holds no checkpoint of the trial, and PBT, which restarts a weak trial from a strong trial's Tune
checkpoint, skips every exploit. Under ``sweep.scheduler=pbt`` a trial runs ``fit`` in a thread instead, with
:class:`CheckpointRelay` in the trainer's callbacks sending each report and its checkpoint's path through a
one-slot queue to the trial's own thread, which reports both to Tune (Tune copies the checkpoint into the trial's
``tune-<id>/`` folder, where it outlives Ray Train's retention of the donor's run).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ray.train import UserCallback
from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler
from ray.util.queue import Empty, Queue

from elastic_train.compat import features

POLL_S = 0.5


class CheckpointRelay(UserCallback):
    """Runs in the Ray Train controller: every report (rank 0's metrics) and its checkpoint path into ``queue``."""

    def __init__(self, queue: Queue, timeout_s: float = 600.0):
        self.queue, self.timeout_s = queue, timeout_s

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any | None) -> None:
        # Blocks while Tune holds the previous report (one slot), as TuneReportCallback does; bounded.
        self.queue.put((dict(metrics[0]), checkpoint.path if checkpoint else None), timeout=self.timeout_s)


def fit_reporting_checkpoints(run: Callable[[list[Any]], Any]) -> Any:
    """``run(callbacks)`` (a ``fit``) in a thread; its reports go to Tune with their checkpoints from this one."""
    from ray import tune
    from ray.tune import Checkpoint

    # Tune's report in this process logs "Checkpoint successfully created at: ..." at INFO for every report (Ray
    # Train's storage module, under Ray's public ``ray.train`` logger): on the sweep's console, once per epoch per
    # trial. The sweep prints its own line per trial (progress.py).
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    queue = Queue(maxsize=1, actor_options={"num_cpus": 0})
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["outcome"] = run([CheckpointRelay(queue)])
        except BaseException as e:  # re-raised in the trial's thread below
            box["error"] = e

    thread = threading.Thread(target=target, name="trial-fit", daemon=True)
    thread.start()
    try:
        while True:
            try:
                metrics, path = queue.get(timeout=POLL_S)
            except Empty:
                if thread.is_alive():
                    continue
                if queue.empty():  # the run ended and its last report is through
                    break
                continue
            checkpoint = Checkpoint(path) if path else None
            tune.report({**metrics, "checkpoint_path": path} if path else metrics, checkpoint=checkpoint)
        thread.join()
    finally:
        queue.shutdown(force=True)
    if "error" in box:
        raise box["error"]
    return box["outcome"]


class LastReportKeepsPBT(PopulationBasedTraining):
    """PBT that takes no decision on a trial's last report (``time_attr`` at ``max_t``): exploiting there would
    restart the weak trial from the donor's final checkpoint with nothing left to train, and pausing it would
    cut off its final summary and MLflow run. A decision is made at every earlier perturbation point as usual
    (public: our own copies of ``time_attr`` and ``synch``, Tune's public scheduler hooks).

    Under ``synch``, with the internal feature ``pbt_sync`` (it reads PBT's private sync state): the trial whose
    report completes the sync point and that is not exploited goes on instead of being paused (one Ray Train
    restart fewer per decision), and trials waiting at a sync point that a finished trial will never reach go on
    (seen after a resumed sweep: they waited, PAUSED, for ever). Without it, Ray's own synchronous PBT."""

    def __init__(self, *args: Any, max_t: int, time_attr: str = "training_iteration", synch: bool = False,
                 **kwargs: Any):
        super().__init__(*args, time_attr=time_attr, synch=synch, **kwargs)
        self.max_t, self.time_attr, self.synch = max_t, time_attr, synch

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if result.get(self.time_attr, 0) >= self.max_t:
            return TrialScheduler.CONTINUE
        if not (self.synch and features.enabled("pbt_sync")):
            return super().on_trial_result(tune_controller, trial, result)
        features.note("pbt_sync")
        synced = self._next_perturbation_sync
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.PAUSE and self._next_perturbation_sync != synced:
            # Synchronous PBT pauses every trial at the sync point, the one whose report completed it too. That
            # trial was not exploited (an exploited one is paused already: NOOP) and has nothing to wait for:
            # pausing would only restart it from its own checkpoint, a new Ray Train run. It goes on instead.
            return TrialScheduler.CONTINUE
        return decision

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        super().on_trial_complete(tune_controller, trial, result)
        self.release_waiters(tune_controller, ended=trial)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        super().on_trial_error(tune_controller, trial)
        self.release_waiters(tune_controller, ended=trial)

    def release_waiters(self, tune_controller: Any, ended: Any) -> None:
        """Under ``synch`` a trial paused at the sync point waits until every live trial reached it. A trial that
        ended first (its last report takes no decision, above) never will: seen after a resumed sweep, where the
        scheduler starts afresh and the weak trial finished while the strong one waited, PAUSED, for ever. Once
        no other live trial is still on its way to the sync point, the waiting trials go on (no decision there)."""
        if not (self.synch and features.enabled("pbt_sync")):
            return
        live = [t for t in tune_controller.get_live_trials() if t is not ended and t in self._trial_state]
        if not live or any(t.status != "PAUSED" and self._trial_state[t].last_train_time
                           < self._next_perturbation_sync for t in live):
            return
        self._next_perturbation_sync = max(self._trial_state[t].last_train_time for t in live) + \
            self._perturbation_interval
