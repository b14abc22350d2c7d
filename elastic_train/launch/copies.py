"""The run's checkpoints copied into its tracking run from the driver, as Ray Train persists them.

While ``fit`` runs, :class:`CheckpointWatch` lists the run's storage folder every :data:`POLL_S` (public
pyarrow; no Ray Train callback, whose hooks on each report are internal) and offers each checkpoint that is
complete there (every rank's part: :func:`~elastic_train.train.worker.complete_on_storage`), with the metrics
it was reported with (its ``meta.json``), to the backend's copier (tracking/checkpoints.py), oldest first. When
``fit`` returns, one last look, then the copier finishes (bounded) and its tally goes to the run's summary. A
checkpoint Ray's retention deletes between two looks is never offered: only ``log_checkpoints=all`` wants every
one, and a copy of one that vanished under the copier is counted unsent and said once.
"""

from __future__ import annotations

import threading
from typing import Any

from elastic_train import runlog

POLL_S = 2.0
FINISH_S = 60.0


class CheckpointWatch:
    """``with CheckpointWatch(copier, (fs, root)) as watch: fit...``; ``watch.tally`` afterwards."""

    def __init__(self, copier: Any, store: tuple[Any, str], poll_s: float = POLL_S):
        self.copier, self.store, self.poll_s = copier, store, poll_s
        self.tally: dict[str, Any] | None = None
        self._offered: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elastic-train-checkpoint-watch", daemon=True)

    def __enter__(self) -> CheckpointWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll_s + 30)
        self.look()  # what the last report persisted
        self.tally = self.copier.finish(FINISH_S)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.look()

    def look(self) -> None:
        """Offer the complete checkpoints not offered yet, oldest first. A listing that fails is tried again at
        the next look (said once in the run's log)."""
        from elastic_train.train.worker import checkpoint_folders, complete_on_storage, reported_metrics

        fs, root = self.store
        try:
            names = [n for n in checkpoint_folders(fs, root) if n not in self._offered]
            for name in names:
                path = f"{root}/{name}"
                if not complete_on_storage(fs, path):
                    continue  # still uploading: the next look
                self._offered.add(name)
                self.copier.offer(_checkpoint(fs, path), reported_metrics(fs, path))
        except Exception as e:
            runlog.dropped("a look at the run's storage for checkpoints to copy into the tracking run (tried "
                           "again at the next one)", e, once="checkpoint watch")


def _checkpoint(fs: Any, path: str) -> Any:
    from ray.train import Checkpoint

    return Checkpoint(path, filesystem=fs)
