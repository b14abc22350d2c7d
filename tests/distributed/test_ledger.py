"""The run's ledger in the GCS's key-value store (train/ledger.py): what rank 0 puts in a worker process reaches
the driver once flushed, the newest book wins, a fit's entries go with ``drop``, and a slow GCS never holds the
training thread."""

from __future__ import annotations

import threading
import time
import uuid

import ray

from elastic_train.train import ledger as ledger_mod
from elastic_train.train.ledger import RunLedger


@ray.remote(num_cpus=0)
def _rank0(key: str) -> bool:
    book = RunLedger(key)
    for step in range(1, 51):
        book.put({"last_step": step})
    return book.flush(10.0)


def test_a_book_put_in_a_worker_process_reaches_the_driver_and_drop_removes_the_fits_entries(ray_session):
    key = uuid.uuid4().hex
    assert ray.get(_rank0.remote(key), timeout=60) is True
    ledger = RunLedger(key)
    assert ledger.get() == {"last_step": 50}  # the newest book, not a queue of 50
    ledger.put_final({"val_loss": 0.5})
    assert ledger.get_final() == {"val_loss": 0.5}
    other = RunLedger(uuid.uuid4().hex)  # another fit (a sweep's next trial): its own key
    assert other.get() is None
    ledger.drop()
    assert ledger.get() is None and ledger.get_final() is None


def test_a_put_never_waits_for_the_gcs_and_the_newest_value_supersedes_what_was_not_sent(monkeypatch):
    """The sender thread is held inside a send (a GCS that does not answer); puts still return at once, and
    when it is let go it sends only the newest of what came meanwhile."""
    sent: list[bytes] = []
    inside, release = threading.Event(), threading.Event()

    def slow_put(key: bytes, value: bytes, namespace: bytes, timeout_s: float) -> None:
        inside.set()
        assert release.wait(30)
        sent.append(value)

    monkeypatch.setattr(ledger_mod, "kv_put", slow_put)
    sender = ledger_mod._Sender()  # this test's own, not the process's
    sender.post(b"k/book", b"1")
    assert inside.wait(10)
    t0 = time.monotonic()
    for value in (b"2", b"3", b"4"):
        sender.post(b"k/book", value)
    assert time.monotonic() - t0 < 0.5  # nothing waited on the held send
    assert sender.flush(0.2) is False  # bounded: the held send is still out
    release.set()
    assert sender.flush(10) is True
    assert sent == [b"1", b"4"]
