"""One metrics sender per run at a time: a lock file that fences a dead worker's orphaned sender.

Rank 0's sender child (tracking/sender.py) outlives a worker that dies, on purpose: it still sends what it holds
(bounded, then it spools). A restarted worker's new sender must not ask MLflow for the run's last logged step
while such an orphan can still deliver steps after the answer: the restarted run would log those steps again (a
step twice), or, trusting its own record instead, skip steps the orphan never delivered (a step missing).

So every sender takes an exclusive ``flock`` on one file per run (next to the run's spool, so in the shared
storage folder when the storage path is a shared file system) before it sends anything, and holds it until it
exits; the operating system drops it when the process dies, however it dies. A new sender waits for the lock,
bounded (:data:`WAIT_S`, longer than an orphan's own flush bound), then reads the floor. With an object-store
storage path the spool folder is local to each node: a sender is then fenced only from orphans on its own node.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

# An orphan exits at most ~185 s after its training process died: 60 s to connect, 120 s to flush, then a spool
# write. A live sender that still holds the lock after this (a worker Ray failed to kill) is no orphan: go on.
WAIT_S = 200.0


def lock_path(spool_path: str | Path, run_id: str) -> Path:
    """The run's sender lock file: beside its spool."""
    return Path(spool_path).parent / f".sender-{run_id}.lock"


class SenderFence:
    """An exclusive lock on ``path``, taken once (:meth:`acquire`) and held until the process exits."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.held = False
        self.waited_s = 0.0
        self._fd: int | None = None

    def acquire(self, timeout_s: float = WAIT_S, cancel: threading.Event | None = None) -> bool:
        """Wait (bounded; ``cancel`` ends it early) until no other sender of the run holds the lock; True when
        it is now ours. False: timed out or cancelled (the caller goes on unfenced)."""
        try:
            import fcntl
        except ImportError:  # no flock (Windows): nothing to fence with
            return False
        t0 = time.monotonic()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            log.warning("metrics sender lock %s unavailable (%s): sending unfenced", self.path, e)
            return False
        deadline = t0 + timeout_s
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
                break
            except BlockingIOError:
                pass
            except OSError as e:  # a file system without locks
                log.warning("metrics sender lock %s unavailable (%s): sending unfenced", self.path, e)
                break
            left = deadline - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                if left <= 0:
                    log.warning("another metrics sender of this run still holds %s after %.0f s: sending anyway",
                                self.path, timeout_s)
                break
            if cancel is not None:
                cancel.wait(min(0.2, left))
            else:
                time.sleep(min(0.2, left))
        self.waited_s = time.monotonic() - t0
        return self.held

    def release(self) -> None:
        """Let the next sender go (process exit does the same)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self.held = None, False
