"""Copy persisted checkpoints into MLflow artifacts, off the training thread, from the driver.

The run's driver offers every checkpoint Ray Train has persisted (launch/copies.py watches the run's storage
folder; public APIs only: Ray Train's callbacks that would see each report on the controller are internal, and
its public ``UserCallback`` gets no end-of-run hook to finish the copies). Per ``tracking.log_checkpoints`` a
:class:`CheckpointCopier` queues uploads to a background sender:

* ``last``: ``checkpoints/last`` is overwritten by each newer checkpoint (pending ones are coalesced);
* ``best``: ``checkpoints/best`` whenever the score improves (tag ``best_checkpoint`` names it; of the pending
  ones, only the best is copied: Ray Train's retention, by the same score, keeps it, while it may already have
  deleted the others);
* ``all``:  every checkpoint under ``checkpoints/<dir name>``.

:meth:`CheckpointCopier.offer` only enqueues and never raises: a tracking outage must not fail the run. The
thread snapshots each checkpoint to local disk (Ray may delete it later under its retention policy) and hands it
to the tracker, which retries while the server is away.

**Copies leave nothing behind and never vanish.** A snapshot is a folder in ``mlflow_checkpoint_copies/`` beside
the run's tracking spool (the run's local folder, not ``/tmp``), and the tracker removes it once every upload of it
is sent. What the tracker cannot send by the end is spooled with its folder, which stays for ``replay_spool``. A
snapshot that fails (the checkpoint already gone from storage, a full disk) prints one warning naming it. The
tally, copies sent and not, is what :meth:`CheckpointCopier.finish` returns (the run's summary counts the unsent ones).

**The earlier best is known before ``checkpoints/best`` is replaced.** A resumed job reads the earlier driver's
best score from the run (a tag). While the server does not answer that, no checkpoint replaces
``checkpoints/best`` (it could be worse than the one there): this driver's best candidate waits and is compared
once the answer comes; at the end it is counted unsent if it never did.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

from elastic_train import runlog
from tracking.base import TrackingSpec
from tracking.quiet import quiet_mlflow_logging

log = logging.getLogger(__name__)

BEST_TAG, BEST_SCORE_TAG = "best_checkpoint", "best_checkpoint_score"
COPIES = "mlflow_checkpoint_copies"  # beside the spool: snapshots not yet sent


class CheckpointCopier:
    """The run's checkpoint copies into MLflow, on the driver: :meth:`offer` each persisted checkpoint, then
    :meth:`finish` (bounded) for the tally. The thread starts at the first offer."""

    def __init__(self, spec: TrackingSpec, policy: list[str], score: str, mode: str):
        self.spec, self.policy, self.score, self.mode = spec, set(policy) - {"none"}, score, mode
        quiet_mlflow_logging()
        self._setup_runtime()

    def _setup_runtime(self) -> None:
        self._queue: queue.Queue[tuple[Any, dict[str, Any]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._tracker: Any = None
        self._copies = Path(self.spec.spool_path).parent / COPIES
        self._failed = 0  # copies lost: a snapshot that failed, a best never decided
        self._best: float | None = None
        self._best_known = False  # the earlier driver's best score read from the run (None: there was none)
        self._waiting_best: tuple[Any, dict[str, Any]] | None = None  # a candidate while it is unknown

    def offer(self, checkpoint: Any, metrics: dict[str, Any]) -> None:
        """A persisted checkpoint (a ``ray.train.Checkpoint``) and the metrics it was reported with."""
        if not self.policy:
            return
        self._start()
        self._queue.put((checkpoint, dict(metrics)))

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="mlflow-checkpoints", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------------------ background
    def _work(self) -> None:
        from tracking.mlflow_tracker import MlflowTracker, yield_cpu_to_training

        runlog.attach(Path(self.spec.spool_path).parent)
        yield_cpu_to_training()  # copying checkpoints must not slow the workers sharing this machine
        self._tracker = MlflowTracker(self.spec, start_system_metrics=False)
        self._learn_previous_best()
        while True:
            pending = [self._queue.get()]
            while not self._queue.empty():  # coalesce: only the newest "last" and the best "best" matter
                pending.append(self._queue.get())
            items = [item for item in pending if item is not None]
            best = self._best_of(items)
            for i, item in enumerate(items):
                self._handle(item, last=i == len(items) - 1, best_candidate=item is best)
            if len(items) < len(pending):
                return

    def _best_of(self, items: list[tuple[Any, dict[str, Any]]]) -> tuple[Any, dict[str, Any]] | None:
        scored = [item for item in items if isinstance(item[1].get(self.score), int | float)]
        if "best" not in self.policy or not scored:
            return None
        pick = min if self.mode == "min" else max
        return pick(scored, key=lambda item: item[1][self.score])

    def _handle(self, item: tuple[Any, dict[str, Any]], last: bool, best_candidate: bool = True) -> None:
        checkpoint, metrics = item
        name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
        targets = []
        if "all" in self.policy:
            targets.append(f"checkpoints/{name}")
        if best_candidate and self._is_new_best(item):
            targets.append("checkpoints/best")
            self._tracker.set_tags({BEST_TAG: name, BEST_SCORE_TAG: metrics[self.score]})
        if "last" in self.policy and last:
            targets.append("checkpoints/last")
        if targets:
            self._copy(checkpoint, name, targets)

    def _is_new_best(self, item: tuple[Any, dict[str, Any]]) -> bool:
        """Whether ``item`` becomes ``checkpoints/best``. While the earlier best is unknown the candidate waits
        (the best of those seen meanwhile); once it is known, the waiting one is decided first."""
        score = item[1].get(self.score)
        if "best" not in self.policy or not isinstance(score, int | float):
            return False
        if not self._learn_previous_best():
            waiting = self._waiting_best
            if waiting is None or self._improves(score, waiting[1][self.score]):
                self._waiting_best = item
            return False
        if self._waiting_best is not None:  # decided first, unless this one is better anyway
            waiting, self._waiting_best = self._waiting_best, None
            if not self._improves(score, waiting[1][self.score]):
                self._decide_best(waiting)
        if not self._improves(score, self._best):
            return False
        self._best = float(score)
        return True

    def _decide_best(self, item: tuple[Any, dict[str, Any]]) -> None:
        """A candidate that waited for the earlier best: ``checkpoints/best`` if it is better."""
        if self._is_new_best(item):
            name = item[0].path.rstrip("/").rsplit("/", 1)[-1]
            self._tracker.set_tags({BEST_TAG: name, BEST_SCORE_TAG: item[1][self.score]})
            self._copy(item[0], name, ["checkpoints/best"])

    def _copy(self, checkpoint: Any, name: str, targets: list[str]) -> None:
        """Snapshot ``checkpoint`` beside the spool and queue its uploads; the tracker removes the snapshot once
        they are sent. A snapshot that fails: one warning, counted."""
        local = self._copies / f"{name}-{uuid.uuid4().hex[:8]}"
        try:
            with checkpoint.as_directory() as d:
                shutil.copytree(d, local)
        except Exception as e:
            shutil.rmtree(local, ignore_errors=True)
            self._failed += 1
            log.warning("MLflow: %s was not copied into the tracking run as %s (%s: %s); the checkpoint itself is "
                        "unaffected (%s)", name, ", ".join(targets), type(e).__name__, str(e)[:200], checkpoint.path)
            return
        for target in targets:
            self._tracker.log_checkpoint(str(local), target)
        self._tracker.remove_when_sent(str(local))

    def _improves(self, score: float, best: float | None) -> bool:
        if best is None:
            return True
        return score < best if self.mode == "min" else score > best

    def _learn_previous_best(self) -> bool:
        """A resumed job keeps the earlier driver's best (a tag on the run); whether it is known (also: none)."""
        if self._best_known:
            return True
        try:
            from mlflow.tracking import MlflowClient

            tags = MlflowClient(tracking_uri=self.spec.uri).get_run(self.spec.run_id).data.tags
        except Exception as e:  # the server is away: asked again at the next candidate
            runlog.dropped("the earlier best checkpoint's score: checkpoints/best waits until the server answers", e)
            return False
        self._best = float(tags[BEST_SCORE_TAG]) if BEST_SCORE_TAG in tags else None
        self._best_known = True
        return True

    def finish(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Finish the copies (bounded), close the tracker; the tally: ``{"sent", "unsent", "spool_path"}`` copies
        (uploads), the unsent ones spooled or never made."""
        if self._thread is None:
            return {"sent": 0, "unsent": 0, "spool_path": None}
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        if self._waiting_best is not None and self._tracker is not None:
            self._decide_best(self._waiting_best)  # the server may answer by now
            if self._waiting_best is not None:
                self._failed += 1
                log.warning("MLflow: checkpoints/best was not updated: the run's earlier best score could not be "
                            "read (see the run's log)")
        closed = self._tracker.close(timeout_s) if self._tracker is not None else {}
        unsent = self._failed + closed.get("unsent_artifacts", 0)
        out = {"sent": closed.get("sent_artifacts", 0), "unsent": unsent, "spool_path": closed.get("spool_path")}
        if self._copies.is_dir() and not any(self._copies.iterdir()):
            self._copies.rmdir()
        return out

