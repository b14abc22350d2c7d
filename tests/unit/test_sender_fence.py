"""tracking/fence.py: one metrics sender per run at a time; a second waits, bounded, and can be cancelled."""

from __future__ import annotations

import threading
import time

from tracking.fence import SenderFence, lock_path


def test_a_second_sender_waits_for_the_first_bounded_and_gets_the_lock_once_it_is_gone(tmp_path):
    path = lock_path(tmp_path / "run" / "mlflow_unsent.jsonl", "abc")
    assert path == tmp_path / "run" / ".sender-abc.lock"
    orphan, restarted = SenderFence(path), SenderFence(path)
    assert orphan.acquire(timeout_s=1) and orphan.held  # creates the folder and the file
    t0 = time.monotonic()
    assert not restarted.acquire(timeout_s=0.5) and not restarted.held  # bounded: gives up, goes on unfenced
    assert 0.4 <= time.monotonic() - t0 < 5
    cancel = threading.Event()
    cancel.set()
    t0 = time.monotonic()
    assert not SenderFence(path).acquire(timeout_s=60, cancel=cancel)  # a closing sender stops waiting at once
    assert time.monotonic() - t0 < 5
    got = threading.Event()
    waiter = threading.Thread(target=lambda: got.set() if restarted.acquire(timeout_s=30) else None)
    waiter.start()
    orphan.release()  # the orphan sent what it held and exited
    waiter.join(30)
    assert got.is_set() and restarted.held
    restarted.release()
