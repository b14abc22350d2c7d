"""A replaced writer writes nothing (DESIGN invariant 12): each worker group's attempt, fenced in run storage.

A worker cut off by a partition can wake up after the run has restarted without it. Ray declares its node dead
and starts a new worker group elsewhere, but the old worker (and the metrics sender beside it) may still hold
a checkpoint to upload, metrics to send and trace lines to write, for steps the run has since recomputed. The
fence makes those writes refusable:

* **Claim.** Every worker group that starts claims the run's next attempt number: rank 0 lists
  ``<run storage>/.attempts/``, writes the next ``attempt-NNNNNNNN`` marker there before anything else is written,
  and broadcasts the number to every rank. The storage folder is what every host already shares (S3, GCS,
  NFS), so the newest marker is the one truth every host can read. Only one worker group of a run is alive at a
  time (Ray Train starts the next one after the last one is declared dead), so the claim needs no lock.
* **Check.** A checkpoint upload checks the newest marker right before it starts (:meth:`AttemptFence.current`,
  one listing): a superseded rank uploads nothing and fails. Per-step writes (trace lines, metrics handed to the
  sender) check a flag that a watcher thread refreshes every :data:`WATCH_S` seconds
  (:meth:`AttemptFence.may_write`): no listing per step. Rank 0's metrics sender fences itself in the tracking
  store (tracking/mlflow_tracker.py: the run's ``elastic_train.attempt`` tag, read before every batch).
* **Stamp.** Checkpoints (``meta.json``), trace lines and the sender's tag carry the attempt that wrote them.

A storage listing that fails (an outage) does not stop a worker from writing trace lines or metrics: a live run
rides out short outages (data/filesystems.py), and refusing while unsure would drop a healthy run's metrics. A
cut-off worker learns it is stale at its first listing once it can talk again, before its next checkpoint;
what it writes in between is bounded by one watch period.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

FOLDER = ".attempts"
PREFIX = "attempt-"
WATCH_S = 2.0


class Superseded(RuntimeError):
    """This worker group's attempt is no longer the run's newest: it must not write."""


def _number(name: str) -> int | None:
    if not name.startswith(PREFIX):
        return None
    try:
        return int(name[len(PREFIX):])
    except ValueError:
        return None


class AttemptFence:
    """One worker's view of the run's attempts in ``root`` (the run's storage folder on ``fs``, a pyarrow
    filesystem)."""

    def __init__(self, fs: Any, root: str, attempt: int):
        self.fs, self.folder, self.attempt = fs, f"{root.rstrip('/')}/{FOLDER}", attempt
        self.superseded_by: int | None = None
        self.watched = 0  # the watcher's listings so far, failed ones included
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # ---- claim (rank 0, at the start of a worker group)
    @classmethod
    def claim(cls, fs: Any, root: str) -> AttemptFence:
        """Write the next attempt's marker; the fence of it."""
        probe = cls(fs, root, 0)
        newest = probe.newest() or 0
        fence = cls(fs, root, newest + 1)
        fs.create_dir(fence.folder, recursive=True)
        with fs.open_output_stream(f"{fence.folder}/{PREFIX}{fence.attempt:08d}") as f:
            f.write(json.dumps({"attempt": fence.attempt, "host": socket.gethostname(), "pid": os.getpid(),
                                "unix": time.time()}).encode())
        return fence

    # ---- checks
    def newest(self) -> int | None:
        """The newest attempt in storage (None: none yet). Raises when storage cannot be listed."""
        import pyarrow.fs

        infos = self.fs.get_file_info(pyarrow.fs.FileSelector(self.folder, allow_not_found=True))
        numbers = [n for i in infos if (n := _number(i.base_name)) is not None]
        return max(numbers) if numbers else None

    def current(self) -> bool:
        """Whether this attempt is still the newest (a listing now). Raises when storage cannot be listed: a
        checkpoint that cannot reach storage fails anyway."""
        newest = self.newest() or 0
        if newest > self.attempt:
            self.superseded_by = newest
        return self.superseded_by is None

    def check(self, what: str) -> None:
        """Raise :class:`Superseded` unless this attempt is still the newest (``what``: the write refused)."""
        if not self.current():
            raise Superseded(f"attempt {self.attempt} was superseded by attempt {self.superseded_by}: "
                             f"{what} refused (this worker was cut off while the run restarted without it)")

    def may_write(self) -> bool:
        """The watcher's last word: False once a newer attempt was seen (no listing here)."""
        return self.superseded_by is None

    # ---- the watcher (per-step writes)
    def watch(self, period_s: float = WATCH_S) -> AttemptFence:
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, args=(period_s,), name="attempt-fence",
                                             daemon=True)
            self._watcher.start()
        return self

    def _watch(self, period_s: float) -> None:
        while not self._stop.wait(period_s) and self.superseded_by is None:
            try:
                self.current()
            except Exception as e:  # an outage: keep writing (see the module docstring)
                log.debug("attempt fence: listing failed: %s", e)
            self.watched += 1

    def stop(self) -> None:
        self._stop.set()
