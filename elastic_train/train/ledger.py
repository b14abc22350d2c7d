"""The run's ledger: what must outlive a worker group, kept in the GCS's key-value store under one key per fit.

Rank 0 keeps the run's goodput book (train/goodput.py) there at log cadence and reads it back after a restart; an
evaluation's rank 0 leaves its all-reduced metrics there for the driver; the driver reads both after the trainer
returns and deletes the fit's entries. It holds no training state: losing it only loses the accounting of the
current driver's lifetime, never data.

**Why the GCS, not an actor.** Until 2026-12-06 the ledger was an actor of its own (``RunLedger``): a Python
process per run (~125 MB resident, ~1-2 s of a core to start at launch), which woke ~150 times a second for the
whole run (Ray's core worker checks for signals every 10 ms) beside training threads that, on a small node, hold
every core. The GCS is a process every cluster already has, on the head, and it outlives worker nodes as that
actor (pinned to the driver's node) did. A sweep's trials no longer share an actor either: each fit has its key.

**The training thread never waits on the GCS.** :meth:`RunLedger.put` hands the book to one sender thread per
process, which sends the newest value per key (an unsent older book is superseded, never queued behind).
:meth:`RunLedger.flush` waits, bounded, until what was put has been sent: the end of an attempt calls it, so the
driver reads the final book. Every GCS call has a timeout; a failed send is written to the run's log
(elastic_train/runlog.py, once) and the next book supersedes it; a flush whose newest book failed says False, so
the end of an attempt says on the console that the summary may miss its end.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass
from typing import Any

from elastic_train import runlog
from elastic_train.compat.ray_core import kv_delete_prefix, kv_get, kv_put

NAMESPACE = b"elastic_train_ledger"
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunLedger:
    """One fit's entries (``key``: a fresh uuid per fit). Plain and picklable: the driver makes it, the workers
    get it in their arguments, and both talk to the GCS of the cluster they are in."""

    key: str

    def _name(self, what: str) -> bytes:
        return f"{self.key}/{what}".encode()

    def put(self, book: dict[str, Any]) -> None:
        """The goodput book, sent by this process's sender thread (never blocks the caller on the GCS)."""
        _sender().post(self._name("book"), pickle.dumps(book))

    def flush(self, timeout_s: float = TIMEOUT_S) -> bool:
        """Wait until everything this process put has been sent; False when the time ran out or the newest value
        of a key could not be sent."""
        return _sender().flush(timeout_s)

    def get(self) -> dict[str, Any] | None:
        return _load(kv_get(self._name("book"), NAMESPACE, TIMEOUT_S))

    def put_final(self, metrics: dict[str, Any]) -> None:
        """An evaluation's metrics for the driver: sent at once (the caller ends right after)."""
        kv_put(self._name("final"), pickle.dumps(metrics), NAMESPACE, TIMEOUT_S)

    def get_final(self) -> dict[str, Any] | None:
        return _load(kv_get(self._name("final"), NAMESPACE, TIMEOUT_S))

    def put_tracking_copies(self, tally: dict[str, Any]) -> None:
        """The checkpoint copies into the tracking run, as the Train controller's callback ends: how many were
        sent and how many not (tracking/checkpoints.py). Sent at once; the driver reads it for the summary."""
        kv_put(self._name("copies"), pickle.dumps(tally), NAMESPACE, TIMEOUT_S)

    def get_tracking_copies(self) -> dict[str, Any] | None:
        return _load(kv_get(self._name("copies"), NAMESPACE, TIMEOUT_S))

    def drop(self) -> None:
        """Delete this fit's entries (the driver, once it has read them)."""
        kv_delete_prefix(f"{self.key}/".encode(), NAMESPACE, TIMEOUT_S)


def _load(raw: bytes | None) -> dict[str, Any] | None:
    return pickle.loads(raw) if raw else None


class _Sender:
    """One daemon thread per process sending the newest value of each key to the GCS."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._latest: dict[bytes, bytes] = {}
        self._sending = False
        self._failed: set[bytes] = set()  # keys whose newest value was not sent
        self._thread: threading.Thread | None = None

    def post(self, key: bytes, value: bytes) -> None:
        with self._cond:
            self._latest[key] = value
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ledger-sender", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._latest and not self._sending, timeout_s) and not self._failed

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._latest))
                items, self._latest, self._sending = self._latest, {}, True
            failed = set()
            for key, value in items.items():
                try:
                    kv_put(key, value, NAMESPACE, TIMEOUT_S)
                except Exception as e:  # the GCS is away or slow: accounting only, the next book supersedes it
                    failed.add(key)
                    runlog.dropped(f"a goodput book for the GCS key-value store ({key.decode()})", e,
                                   once="ledger send")
            with self._cond:
                self._failed = (self._failed - set(items)) | failed  # a newer value sent clears it
                self._sending = False
                self._cond.notify_all()


_SENDER: _Sender | None = None
_SENDER_LOCK = threading.Lock()


def _sender() -> _Sender:
    global _SENDER
    with _SENDER_LOCK:
        if _SENDER is None:
            _SENDER = _Sender()
        return _SENDER
