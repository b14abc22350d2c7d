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

**Public path.** The GCS's key-value store is reached through an internal client (feature ``gcs_ledger``,
compat/features.py): with it off, or on a Ray without it, the ledger is the public thing it was before, a named
actor of the driver's job (:class:`_LedgerActor`, no CPU reserved) holding the same keys; :meth:`RunLedger.create`
picks, and the workers get whichever it made.

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
from elastic_train.compat import features

NAMESPACE = b"elastic_train_ledger"
TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunLedger:
    """One fit's entries (``key``: a fresh uuid per fit). Plain and picklable: the driver makes it, the workers
    get it in their arguments, and both talk to the GCS of the cluster they are in, or to ``actor`` when the
    run's ledger is an actor (:meth:`create`)."""

    key: str
    actor: Any | None = None

    @classmethod
    def create(cls, key: str) -> RunLedger:
        """The GCS's store with ``gcs_ledger``, else a ledger actor (public API; one process for the run)."""
        if features.enabled("gcs_ledger"):
            return cls(key)
        import ray

        actor = ray.remote(num_cpus=0)(_LedgerActor).options(name=f"elastic-train-ledger-{key}").remote()
        return cls(key, actor)

    def _name(self, what: str) -> bytes:
        return f"{self.key}/{what}".encode()

    def _put(self, key: bytes, value: bytes) -> None:
        if self.actor is None:
            from elastic_train.compat.ray_core import kv_put

            kv_put(key, value, NAMESPACE, TIMEOUT_S)
        else:
            import ray

            ray.get(self.actor.put.remote(key, value), timeout=TIMEOUT_S)

    def _get(self, key: bytes) -> dict[str, Any] | None:
        if self.actor is None:
            from elastic_train.compat.ray_core import kv_get

            return _load(kv_get(key, NAMESPACE, TIMEOUT_S))
        import ray

        return _load(ray.get(self.actor.get.remote(key), timeout=TIMEOUT_S))

    def put(self, book: dict[str, Any]) -> None:
        """The goodput book, sent by this process's sender thread (never blocks the caller on the GCS)."""
        _sender().post(self, self._name("book"), pickle.dumps(book))

    def flush(self, timeout_s: float = TIMEOUT_S) -> bool:
        """Wait until everything this process put has been sent; False when the time ran out or the newest value
        of a key could not be sent."""
        return _sender().flush(timeout_s)

    def get(self) -> dict[str, Any] | None:
        return self._get(self._name("book"))

    def put_final(self, metrics: dict[str, Any]) -> None:
        """An evaluation's metrics for the driver: sent at once (the caller ends right after)."""
        self._put(self._name("final"), pickle.dumps(metrics))

    def get_final(self) -> dict[str, Any] | None:
        return self._get(self._name("final"))

    def drop(self) -> None:
        """Delete this fit's entries (the driver, once it has read them), or end its actor."""
        if self.actor is None:
            from elastic_train.compat.ray_core import kv_delete_prefix

            kv_delete_prefix(f"{self.key}/".encode(), NAMESPACE, TIMEOUT_S)
        else:
            import ray

            ray.kill(self.actor)


class _LedgerActor:
    """The ledger's public path: a dict in an actor of the driver's job, gone with it."""

    def __init__(self) -> None:
        self.entries: dict[bytes, bytes] = {}

    def put(self, key: bytes, value: bytes) -> None:
        self.entries[key] = value

    def get(self, key: bytes) -> bytes | None:
        return self.entries.get(key)


def _load(raw: bytes | None) -> dict[str, Any] | None:
    return pickle.loads(raw) if raw else None


class _Sender:
    """One daemon thread per process sending the newest value of each key to the GCS."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._latest: dict[bytes, tuple[RunLedger, bytes]] = {}
        self._sending = False
        self._failed: set[bytes] = set()  # keys whose newest value was not sent
        self._thread: threading.Thread | None = None

    def post(self, ledger: RunLedger, key: bytes, value: bytes) -> None:
        with self._cond:
            self._latest[key] = (ledger, value)
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
            for key, (ledger, value) in items.items():
                try:
                    ledger._put(key, value)
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
