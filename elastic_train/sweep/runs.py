"""Each trial's tracking run, opened and closed by the sweep's driver: a trial's process never opens the store.

A trial used to create its MLflow child run itself (import MLflow, open the store, log params, tags and the
dataset) before its trainer started, and to close it (final metrics, status) after: ~3-4 s of every trial on
a 2-core machine, in series with its training. The sweep's driver has MLflow imported and the store open
already, so :class:`TrialRuns` (a Tune callback, in the driver) does both:

* ``on_trial_start`` -- Tune calls it once the trial's actor is up and before the trial function runs (Tune
  schedules the trial's first ``train()`` after its callbacks): the child run is created or found (a restored
  sweep), its params, tags, hyperparameter values (``hp.*`` at the step the trial starts from) and dataset input
  are logged, and ``<sweep>/trial_runs/<trial run>.json`` names it. The trial reads that file and hands the run
  to its workers, whose rank 0 logs the steps as in any run.
* ``on_trial_complete`` / ``on_trial_error`` -- the trial wrote its summary next to it; a driver thread logs
  the final metrics, goodput and status, while Tune goes on with the next trial. :meth:`TrialRuns.drain` waits
  for those before the sweep's results are collected.

A trial without the file (tracking failed in the driver, or the trial builds data of its own that the driver
never saw) opens and closes its run itself, as before. Credentials never go in the file: the trial takes them
from the parent run's spec it was handed in memory.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

from ray.tune import Callback

from elastic_train.launch import context
from elastic_train.launch.context import RunContext
from elastic_train.launch.storage import RunStorage
from elastic_train.launch.summary import close_run
from elastic_train.sweep.plan import donor_checkpoint, rebuilds_data, trial_context, trial_run_name
from tracking import TrackingSpec, backend_for

log = logging.getLogger(__name__)

RUNS_FOLDER = "trial_runs"  # <sweep dir>/trial_runs/<trial run name>.json (+ .summary.json)


@dataclass(frozen=True)
class Handoff:
    """What a trial needs to log into the run the driver opened (no credentials: those stay in memory)."""

    run_id: str
    experiment_id: str
    spool_path: str
    system_metrics: bool
    log_every_steps: int

    def spec(self, parent: TrackingSpec) -> TrackingSpec:
        return replace(parent, **asdict(self))


def _folder(sweep_dir: str) -> RunStorage:
    return RunStorage(sweep_dir, RUNS_FOLDER)


def read_handoff(sweep_dir: str, run_name: str) -> Handoff | None:
    try:
        text = _folder(sweep_dir).read_text(f"{run_name}.json")
    except OSError:
        return None
    return Handoff(**json.loads(text)) if text else None


def write_summary(sweep_dir: str, run_name: str, summary: dict[str, Any]) -> None:
    """The trial's last act: its summary, for the driver to close the run with."""
    _folder(sweep_dir).write_text(f"{run_name}.summary.json", json.dumps(summary, default=str))


class TrialRuns(Callback):
    """The driver's half of every trial's tracking run (module docstring). ``sweep``: the trials' base context
    (``tuner.resolved_base``); ``dataset``: the sweep data's input record; ``data_object`` tags where a trial's
    data came from."""

    def __init__(self, sweep: RunContext, sweep_dir: str, dataset: dict[str, Any] | None, data_object: str) -> None:
        self.sweep = replace(sweep, bundle=None)
        self.sweep_dir, self.dataset, self.data_object = sweep_dir, dataset, data_object
        self._env_params: dict[str, str] | None = None
        self._setup()

    def _setup(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []
        _LIVE.append(self)

    def __getstate__(self) -> dict[str, Any]:
        """Tune saves its callbacks with the experiment (tuner.pkl, in storage): no credentials in it (this
        driver's MLflow client reads them from its environment; trials get them in memory)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_pool", "_pending")}
        if self.sweep.tracking is not None:
            state["sweep"] = replace(self.sweep, tracking=replace(self.sweep.tracking, env={}))
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:  # a restored sweep's driver
        self.__dict__.update(state)
        self._setup()

    # ------------------------------------------------------------------------------ start
    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        run_name = trial_run_name(trial.trial_id)
        folder = _folder(self.sweep_dir)
        try:  # what an earlier life of the trial left: this life's files are written below
            for suffix in (".json", ".summary.json"):
                folder.remove(f"{run_name}{suffix}")
        except OSError:
            pass
        overrides = dict(trial.config)
        if self.sweep.tracking is None or rebuilds_data(self.sweep, overrides):
            return  # the trial tracks itself (it builds data this driver never saw)
        try:
            handoff = self._open(trial, run_name, overrides)
        except Exception as e:  # close_children sets the status at the sweep's end
            log.warning("trial %s: could not open its tracking run here (%s); the trial opens it", trial.trial_id, e)
            return
        folder.write_text(f"{run_name}.json", json.dumps(asdict(handoff)))

    def _open(self, trial: Any, run_name: str, overrides: dict[str, Any]) -> Handoff:
        parent = self.sweep.tracking
        backend = backend_for(parent, self.sweep.home)
        if self._env_params is None:
            self._env_params = backend.environment_params()
        ctx = trial_context(self.sweep, self.sweep_dir, overrides, run_name)
        spec = context.open_run(ctx, backend, kind="trial", parent_run_id=parent.run_id, dataset=self.dataset,
                                env_params=self._env_params)
        donor = donor_checkpoint(trial.checkpoint, run_name)  # a PBT clone starts from its donor's step
        writer = backend.writer(spec)
        writer.set_tags({"trial_id": trial.trial_id, **{f"sweep.{k}": v for k, v in overrides.items()},
                         "data_object": self.data_object})
        # The hyperparameter schedule as metrics: each life of the trial logs its values at its first step.
        writer.log_metrics({f"hp.{k}": float(v) for k, v in overrides.items() if isinstance(v, int | float)},
                           step=donor[1]["progress"]["global_step"] if donor else 0)
        writer.close(timeout_s=30)
        return Handoff(spec.run_id, spec.experiment_id, spec.spool_path, spec.system_metrics, spec.log_every_steps)

    # ------------------------------------------------------------------------------ end
    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close_later(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close_later(trial, failed=True)

    def _close_later(self, trial: Any, failed: bool) -> None:
        if self.sweep.tracking is None:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="elastic-train-trial-runs")
        self._pending.append(self._pool.submit(self._close, trial.trial_id, failed))

    def _close(self, trial_id: str, failed: bool) -> None:
        """Close the run from the summary the trial wrote; without one (stopped by the scheduler, its process
        gone) the sweep's end gives the run its status (results.close_children)."""
        run_name = trial_run_name(trial_id)
        handoff = read_handoff(self.sweep_dir, run_name)
        text = _folder(self.sweep_dir).read_text(f"{run_name}.summary.json")
        if handoff is None or not text:
            return
        summary = json.loads(text)
        spec = handoff.spec(self.sweep.tracking)
        status = summary.get("status") or ("FAILED" if failed else "FINISHED")
        try:
            close_run(backend_for(spec, self.sweep.home), spec, summary, status)
        except Exception as e:  # close_children sets the status at the sweep's end
            log.warning("trial %s: could not close its tracking run (%s)", trial_id, e)

    def drain(self, timeout_s: float = 120.0) -> None:
        """Wait (bounded) for the runs being closed; then the sweep collects its results."""
        for future in self._pending:
            try:
                future.result(timeout=timeout_s)
            except Exception as e:  # logged; close_children still sets every status
                log.warning("a trial's tracking run did not close: %s", e)
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


_LIVE: list[TrialRuns] = []  # this driver's callbacks, including one a restored Tuner unpickled


def drain_all(timeout_s: float = 120.0) -> None:
    """:meth:`TrialRuns.drain` for every TrialRuns of this driver (the sweep's end)."""
    while _LIVE:
        _LIVE.pop().drain(timeout_s)
