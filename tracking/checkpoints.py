"""Copy persisted checkpoints into MLflow artifacts, off the training thread.

A Ray Train ``UserCallback`` runs on the Train controller, which sees every checkpoint once Ray has
persisted it. Per ``tracking.log_checkpoints`` it queues uploads to a background sender:

* ``last``: ``checkpoints/last`` is overwritten by each newer checkpoint (pending ones are coalesced);
* ``best``: ``checkpoints/best`` whenever the score improves (tag ``best_checkpoint`` names it);
* ``all``:  every checkpoint under ``checkpoints/<dir name>``.

Training never waits: the controller only enqueues, and the sender retries while the server is away.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from typing import Any

from ray.train import Checkpoint, UserCallback
from ray.train.v2._internal.execution.callback import ControllerCallback  # for the end-of-run flush

from tracking.base import TrackingSpec

BEST_TAG, BEST_SCORE_TAG = "best_checkpoint", "best_checkpoint_score"


class MlflowCheckpointCallback(UserCallback, ControllerCallback):
    def __init__(self, spec: TrackingSpec, policy: list[str], score: str, mode: str):
        self.spec, self.policy, self.score, self.mode = spec, set(policy) - {"none"}, score, mode
        self._tracker: Any = None
        self._best: float | None = None
        self._lock = threading.Lock()
        self._pending_last: Checkpoint | None = None
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    # Ray pickles callbacks to the controller: threads and clients are created there, lazily.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_tracker=None, _lock=None, _wake=None, _thread=None, _pending_last=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._wake = threading.Lock(), threading.Event()

    def _ensure_started(self) -> None:
        if self._tracker is not None:
            return
        from mlflow.tracking import MlflowClient

        from tracking.mlflow_tracker import MlflowTracker

        self._tracker = MlflowTracker(self.spec, start_system_metrics=False)
        run = MlflowClient(tracking_uri=self.spec.uri).get_run(self.spec.run_id)
        if BEST_SCORE_TAG in run.data.tags:  # a resumed job: keep the best of the earlier driver
            self._best = float(run.data.tags[BEST_SCORE_TAG])
        self._thread = threading.Thread(target=self._copy_last_loop, name="mlflow-last-checkpoint", daemon=True)
        self._thread.start()

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Checkpoint | None) -> None:
        if checkpoint is None or not self.policy:
            return
        self._ensure_started()
        m = metrics[0] if metrics else {}
        name = checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
        if "all" in self.policy:
            self._upload(checkpoint, f"checkpoints/{name}")
        score = m.get(self.score)
        if "best" in self.policy and isinstance(score, int | float) and self._improves(score):
            self._best = float(score)
            self._upload(checkpoint, "checkpoints/best")
            self._tracker.set_tags({BEST_TAG: name, BEST_SCORE_TAG: score})
        if "last" in self.policy:
            with self._lock:
                self._pending_last = checkpoint
            self._wake.set()

    def _improves(self, score: float) -> bool:
        if self._best is None:
            return True
        return score < self._best if self.mode == "min" else score > self._best

    def _upload(self, checkpoint: Checkpoint, artifact_path: str) -> None:
        """Snapshot the checkpoint locally now (Ray may delete it later), then queue the upload."""
        local = tempfile.mkdtemp(prefix="mlflow-ckpt-")
        with checkpoint.as_directory() as d:
            shutil.copytree(d, local, dirs_exist_ok=True)
        self._tracker.log_checkpoint(local, artifact_path)

    def _copy_last_loop(self) -> None:
        while not self._closed:
            self._wake.wait(1.0)
            self._wake.clear()
            with self._lock:
                ckpt, self._pending_last = self._pending_last, None
            if ckpt is not None:
                try:
                    self._upload(ckpt, "checkpoints/last")
                except Exception:  # noqa: BLE001 - a checkpoint deleted by retention meanwhile: skip it
                    pass

    def after_controller_finish(self, result: Any) -> None:
        self.flush()

    def flush(self, timeout_s: float = 60.0) -> dict[str, Any]:
        if self._tracker is None:
            return {"unsent": 0}
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        return self._tracker.close(timeout_s)
