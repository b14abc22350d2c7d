"""The run's ledger in the run's storage folder (train/ledger.py): what rank 0 puts in a worker process reaches
the driver once flushed, the newest book wins, a fit's entries go with ``drop``, and a slow storage never holds
the training thread."""

from __future__ import annotations

import threading
import time
import uuid

import pyarrow.fs
import ray

from elastic_train.train import ledger as ledger_mod
from elastic_train.train.ledger import RunLedger


@ray.remote(num_cpus=0)
def _rank0(key: str, root: str) -> bool:
    book = RunLedger(key, (pyarrow.fs.LocalFileSystem(), root))
    for step in range(1, 51):
        book.put({"last_step": step})
    return book.flush(10.0)


def test_a_book_put_in_a_worker_process_reaches_the_driver_and_drop_removes_the_fits_entries(ray_session, tmp_path):
    key, store = uuid.uuid4().hex, (pyarrow.fs.LocalFileSystem(), str(tmp_path / "run"))
    assert ray.get(_rank0.remote(key, store[1]), timeout=60) is True
    ledger = RunLedger(key, store)
    assert ledger.get() == {"last_step": 50}  # the newest book, not a queue of 50
    ledger.put_final({"val_loss": 0.5})
    assert ledger.get_final() == {"val_loss": 0.5}
    other = RunLedger(uuid.uuid4().hex, store)  # another fit (a sweep's next trial): its own key
    assert other.get() is None
    ledger.drop()
    assert ledger.get() is None and ledger.get_final() is None


def test_a_put_never_waits_for_storage_and_the_newest_value_supersedes_what_was_not_written(monkeypatch):
    """The sender thread is held inside a write (a storage that does not answer); puts still return at once, and
    when it is let go it writes only the newest of what came meanwhile."""
    written: list[bytes] = []
    inside, release = threading.Event(), threading.Event()

    class Held(RunLedger):
        def _put(self, what: str, value: bytes) -> None:
            inside.set()
            assert release.wait(30)
            written.append(value)

    ledger = Held("k")
    sender = ledger_mod._Sender()  # this test's own, not the process's
    sender.post(ledger, "book", b"1")
    assert inside.wait(10)
    t0 = time.monotonic()
    for value in (b"2", b"3", b"4"):
        sender.post(ledger, "book", value)
    assert time.monotonic() - t0 < 0.5  # nothing waited on the held write
    assert sender.flush(0.2) is False  # bounded: the held write is still out
    release.set()
    assert sender.flush(10) is True
    assert written == [b"1", b"4"]


def test_an_entry_is_written_at_most_once_a_second_unless_a_flush_asks(tmp_path):
    """An object store is not written four times a second (the book is pushed every 0.25 s while training)."""
    writes: list[float] = []

    class Counted(RunLedger):
        def _put(self, what: str, value: bytes) -> None:
            writes.append(time.monotonic())

    ledger, sender = Counted("k"), ledger_mod._Sender()
    deadline = time.monotonic() + 2.6
    while time.monotonic() < deadline:
        sender.post(ledger, "book", b"x")
        time.sleep(0.05)  # a training loop's pushes
    assert sender.flush(5) is True
    gaps = [b - a for a, b in zip(writes, writes[1:-1], strict=False)]  # the last one is the flush's
    assert 2 <= len(writes) <= 5 and all(g >= ledger_mod.MIN_WRITE_S - 0.05 for g in gaps), writes
