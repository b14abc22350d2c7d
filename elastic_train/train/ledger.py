"""The run's ledger: what must outlive a worker group, kept in the run's storage folder under one key per fit.

Rank 0 keeps the run's goodput book (train/goodput.py) there at log cadence and reads it back after a restart; an
evaluation's rank 0 leaves its all-reduced metrics there for the driver; the driver reads both after the trainer
returns and deletes the fit's entries. It holds no training state: losing it only loses the accounting of the
current driver's lifetime, never data.

**Why storage.** The run's storage folder (``checkpoint.storage_path``/<run>) is the one place every node of the
run already shares and that outlives worker groups and nodes (DESIGN invariant 11), reached through public
pyarrow: the entries are small files in ``.ledger/`` beside the checkpoints. Before 2026-12-07 they were in the
GCS's key-value store, through an internal client of Ray's (and before 2026-12-06 in an actor of their own: a
Python process per run that woke ~150 times a second beside training).

**The training thread never waits on storage.** :meth:`RunLedger.put` hands the book to one sender thread per
process, which writes the newest value per key (an unsent older book is superseded, never queued behind), at most
once every :data:`MIN_WRITE_S` per key (an object store is not written four times a second). :meth:`RunLedger.flush`
writes what is pending at once and waits, bounded: the end of an attempt calls it, so the driver reads the final
book. Every write is bounded by the storage's own retries; a failed one is written to the run's log
(elastic_train/runlog.py, once) and the next book supersedes it; a flush whose newest book failed says False, so
the end of an attempt says on the console that the summary may miss its end.
"""

from __future__ import annotations

import pickle
import threading
import time
from dataclasses import dataclass
from typing import Any

from elastic_train import runlog

FOLDER = ".ledger"  # in the run's storage folder, beside the checkpoint folders (which Ray Train alone names)
TIMEOUT_S = 10.0
MIN_WRITE_S = 1.0


@dataclass(frozen=True)
class RunLedger:
    """One fit's entries (``key``: a fresh uuid per fit) in the run's storage folder ``store`` ((pyarrow
    filesystem, path), as the driver and Ray Train see it). Plain and picklable: the driver makes it, the workers
    get it in their arguments."""

    key: str
    store: tuple[Any, str] | None = None

    def _path(self, what: str) -> str:
        if self.store is None:
            raise RuntimeError("this ledger has no storage folder")
        return f"{self.store[1].rstrip('/')}/{FOLDER}/{self.key}.{what}"

    def _put(self, what: str, value: bytes) -> None:
        """Write ``value`` whole: a temporary file renamed over the entry (a reader sees the old or the new)."""
        path = self._path(what)
        fs = self.store[0]
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        tmp = f"{path}.{threading.get_ident()}.tmp"
        with fs.open_output_stream(tmp) as f:
            f.write(value)
        fs.move(tmp, path)

    def _get(self, what: str) -> dict[str, Any] | None:
        import pyarrow.fs

        path = self._path(what)
        fs = self.store[0]
        if fs.get_file_info(path).type != pyarrow.fs.FileType.File:
            return None
        with fs.open_input_stream(path) as f:
            return _load(f.read())

    def put(self, book: dict[str, Any]) -> None:
        """The goodput book, written by this process's sender thread (never blocks the caller on storage)."""
        _sender().post(self, "book", pickle.dumps(book))

    def flush(self, timeout_s: float = TIMEOUT_S) -> bool:
        """Write what this process put now and wait until it is written; False when the time ran out or the newest
        value of an entry could not be written."""
        return _sender().flush(timeout_s)

    def get(self) -> dict[str, Any] | None:
        return self._get("book")

    def put_final(self, metrics: dict[str, Any]) -> None:
        """An evaluation's metrics for the driver: written at once (the caller ends right after)."""
        self._put("final", pickle.dumps(metrics))

    def get_final(self) -> dict[str, Any] | None:
        return self._get("final")

    def drop(self) -> None:
        """Delete this fit's entries (the driver, once it has read them)."""
        import pyarrow.fs

        if self.store is None:
            return
        fs = self.store[0]
        for what in ("book", "final"):
            path = self._path(what)
            if fs.get_file_info(path).type == pyarrow.fs.FileType.File:
                fs.delete_file(path)


def _load(raw: bytes | None) -> dict[str, Any] | None:
    return pickle.loads(raw) if raw else None


class _Sender:
    """One daemon thread per process writing the newest value of each entry, at most every :data:`MIN_WRITE_S`
    per entry unless a flush asks for it now."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._latest: dict[tuple[str, str], tuple[RunLedger, bytes]] = {}  # (fit key, entry) -> (ledger, value)
        self._written: dict[tuple[str, str], float] = {}  # when each entry was last written (monotonic)
        self._sending = False
        self._now = False  # a flush waits: write at once
        self._failed: set[tuple[str, str]] = set()  # entries whose newest value was not written
        self._thread: threading.Thread | None = None

    def post(self, ledger: RunLedger, what: str, value: bytes) -> None:
        with self._cond:
            self._latest[(ledger.key, what)] = (ledger, value)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ledger-sender", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        with self._cond:
            self._now = True
            self._cond.notify_all()
            done = self._cond.wait_for(lambda: not self._latest and not self._sending, timeout_s)
            self._now = False
            return done and not self._failed

    def _due(self) -> float:
        """Seconds until the next pending entry may be written (0: now)."""
        if self._now:
            return 0.0
        now = time.monotonic()
        return max(0.0, min(self._written.get(k, float("-inf")) + MIN_WRITE_S - now for k in self._latest))

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._latest))
                wait = self._due()
                if wait > 0:
                    self._cond.wait(wait)  # a flush, or the next write's time
                    continue
                items, self._latest, self._sending = self._latest, {}, True
            failed = set()
            for entry, (ledger, value) in items.items():
                what = entry[1]
                try:
                    ledger._put(what, value)
                except Exception as e:  # storage is away or slow: accounting only, the next book supersedes it
                    failed.add(entry)
                    runlog.dropped(f"a goodput book for the run's ledger in storage ({ledger.key}.{what})", e,
                                   once="ledger send")
                self._written[entry] = time.monotonic()
            with self._cond:
                self._failed = (self._failed - set(items)) | failed  # a newer value written clears it
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
