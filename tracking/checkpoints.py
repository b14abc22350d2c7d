"""Copy persisted checkpoints into MLflow artifacts, off the training thread.

A Ray Train ``UserCallback`` runs on the Train controller, which sees every checkpoint once Ray has
persisted it. Per ``tracking.log_checkpoints`` it queues uploads to a background sender:

* ``last``: ``checkpoints/last`` is overwritten by each newer checkpoint (pending ones are coalesced);
* ``best``: ``checkpoints/best`` whenever the score improves (tag ``best_checkpoint`` names it);
* ``all``:  every checkpoint under ``checkpoints/<dir name>``.

``after_report`` only enqueues and never raises: a tracking outage must not fail the controller. The
thread snapshots each checkpoint to local disk (Ray may delete it later under its retention policy) and
hands it to the tracker, which retries while the server is away.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from typing import Any

from ray.train import Checkpoint

from elastic_train.compat.ray_train import (  # reports; the end-of-run flush; training's start
    ControllerCallback,
    ReportCallback,
    WorkerGroupCallback,
)
from tracking.base import TrackingSpec
from tracking.quiet import quiet_mlflow_logging

BEST_TAG, BEST_SCORE_TAG = "best_checkpoint", "best_checkpoint_score"


class MlflowCheckpointCallback(ReportCallback, ControllerCallback, WorkerGroupCallback):
    """Ray Train's internal callback kinds, not its public ``UserCallback``: Ray hands a ``UserCallback`` only
    ``after_report`` and ``after_exception`` (UserCallbackHandler), so the end-of-run flush
    (``after_controller_finish``) and the start hook of a ``UserCallback`` were never called; Ray appends
    callbacks of the other kinds to the controller's own list ("custom workarounds built on internal
    callbacks"), where every hook runs."""

    def __init__(self, spec: TrackingSpec, policy: list[str], score: str, mode: str):
        self.spec, self.policy, self.score, self.mode = spec, set(policy) - {"none"}, score, mode
        self._setup_runtime()

    # Ray pickles callbacks to the controller: queues, threads and clients are created there.
    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("spec", "policy", "score", "mode")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled on the controller, and on every worker too (Ray Train hands workers the run config, callbacks
        included): nothing starts here, or each worker would import MLflow and run a sender thread of its own
        while it trains. The controller starts the thread in :meth:`after_worker_group_training_start`."""
        self.__dict__.update(state)
        quiet_mlflow_logging()  # the controller's output is forwarded to the driver's console
        self._setup_runtime()

    def after_worker_group_training_start(self, worker_group: Any) -> None:
        """On the controller, once the workers run the training function: importing MLflow (~2 s of CPU) then
        overlaps their build and first steps, where the workers run at niceness 0 against this process's 15,
        and not their start-up, where both run at 15 and the import took an equal share (measured: the time
        to the first step ~1 s longer on 2 cores). The first checkpoint comes later still."""
        if self.policy:
            self._start()

    def _setup_runtime(self) -> None:
        self._queue: queue.Queue[tuple[Checkpoint, dict[str, Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._tracker: Any = None

    def after_report(self, training_report: Any, metrics: list[dict[str, Any]]) -> None:
        checkpoint = getattr(training_report, "checkpoint", None)
        if checkpoint is None or not self.policy:
            return
        self._start()
        self._queue.put((checkpoint, dict(metrics[0]) if metrics else {}))

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="mlflow-checkpoints", daemon=True)
            self._thread.start()

    def after_controller_finish(self, result: Any) -> None:
        self.flush()

    # ------------------------------------------------------------------------------ background
    def _work(self) -> None:
        from tracking.mlflow_tracker import MlflowTracker, yield_cpu_to_training

        yield_cpu_to_training()  # copying checkpoints must not slow the workers sharing this machine
        self._tracker = MlflowTracker(self.spec, start_system_metrics=False)
        best = self._previous_best()
        while True:
            item = self._queue.get()
            if item is None:
                return
            latest = item
            while not self._queue.empty():  # coalesce: only the newest "last" matters
                nxt = self._queue.get()
                if nxt is None:
                    self._queue.put(None)
                    break
                self._handle(latest, best, last=False)
                best = self._best_after(latest, best)
                latest = nxt
            self._handle(latest, best, last=True)
            best = self._best_after(latest, best)

    def _handle(self, item: tuple[Checkpoint, dict[str, Any]], best: float | None, last: bool) -> None:
        checkpoint, metrics = item
        name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
        score = metrics.get(self.score)
        targets = []
        if "all" in self.policy:
            targets.append(f"checkpoints/{name}")
        if "best" in self.policy and isinstance(score, int | float) and self._improves(score, best):
            targets.append("checkpoints/best")
            self._tracker.set_tags({BEST_TAG: name, BEST_SCORE_TAG: score})
        if "last" in self.policy and last:
            targets.append("checkpoints/last")
        if not targets:
            return
        try:
            local = tempfile.mkdtemp(prefix="mlflow-ckpt-")
            with checkpoint.as_directory() as d:
                shutil.copytree(d, local, dirs_exist_ok=True)
        except Exception:
            return
        for target in targets:
            self._tracker.log_checkpoint(local, target)

    def _best_after(self, item: tuple[Checkpoint, dict[str, Any]], best: float | None) -> float | None:
        score = item[1].get(self.score)
        if isinstance(score, int | float) and self._improves(score, best):
            return float(score)
        return best

    def _improves(self, score: float, best: float | None) -> bool:
        if best is None:
            return True
        return score < best if self.mode == "min" else score > best

    def _previous_best(self) -> float | None:
        """A resumed job keeps the earlier driver's best (a tag); unknown while the server is away."""
        try:
            from mlflow.tracking import MlflowClient

            tags = MlflowClient(tracking_uri=self.spec.uri).get_run(self.spec.run_id).data.tags
            return float(tags[BEST_SCORE_TAG]) if BEST_SCORE_TAG in tags else None
        except Exception:
            return None

    def flush(self, timeout_s: float = 60.0) -> dict[str, Any]:
        if self._thread is None:
            return {"unsent": 0}
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        return self._tracker.close(timeout_s) if self._tracker is not None else {"unsent": 0}
