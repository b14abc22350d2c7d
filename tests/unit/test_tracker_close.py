"""Closing a tracking writer wakes its sender thread at once (it waited up to 0.2 s per close in a 0.2 s queue poll:
twice per sweep trial on the driver's critical path), and that wake-up is never sent, counted or spooled."""

from __future__ import annotations

import json

from tracking import TrackingSpec
from tracking.mlflow_tracker import MlflowTracker


def test_a_closed_writer_with_the_store_away_spools_what_it_was_given_and_nothing_else(tmp_path):
    spool = tmp_path / "unsent.jsonl"
    spec = TrackingSpec(uri="http://127.0.0.1:9", run_id="r1", experiment_id="0", spool_path=str(spool))
    writer = MlflowTracker(spec, start_system_metrics=False)
    writer.log_params({"lr": 0.1})
    writer.set_tags({"k": "v"})
    result = writer.close(timeout_s=0.5)
    assert not writer._thread.is_alive()
    lines = [json.loads(line) for line in spool.read_text().splitlines()]
    assert result["unsent"] == 2 and sorted(line["kind"] for line in lines) == ["param", "tag"], lines


def test_a_closed_writer_sends_everything_and_its_thread_ends(tmp_path):
    from tracking.mlflow_backend import MlflowBackend

    backend = MlflowBackend(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)
    spec, _ = backend.start_run("close", "r", kind="train", spool_path=tmp_path / "spool.jsonl")
    writer = backend.writer(spec)
    writer.log_params({"lr": 0.1})
    writer.log_metrics({"loss": 1.0}, step=1)
    result = writer.close(timeout_s=30)
    assert not writer._thread.is_alive()
    assert result["sent"] == 2 and result["unsent"] == 0 and not (tmp_path / "spool.jsonl").exists()


class Gate:
    """A fence that holds the sender thread before it touches the queue, until the test opens it."""

    def __init__(self):
        import threading

        self.open = threading.Event()

    def acquire(self, timeout_s: float = 0.0, cancel=None) -> bool:
        return self.open.wait(30)


def test_a_flush_waits_for_an_item_the_sender_thread_holds_between_queue_and_pending(tmp_path):
    """The sender thread takes an item from the queue, then adds it to the pending ones under the lock. A flush in
    between saw neither (queue empty, nothing pending), returned True with the item unsent, and the close after it
    spooled the item instead of sending it."""
    from tracking.mlflow_backend import MlflowBackend

    backend = MlflowBackend(f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path)
    spec, _ = backend.start_run("flush", "r", kind="train", spool_path=tmp_path / "spool.jsonl")
    gate = Gate()
    writer = MlflowTracker(spec, start_system_metrics=False, fence=gate)
    writer.log_metrics({"loss": 1.0}, step=1)
    item = writer._queue.get_nowait()  # in the sender thread's hands, as after its queue.get
    assert writer.pending() == 1
    assert writer.flush(timeout_s=0.3) is False
    with writer._lock:
        writer._take(item)
    gate.open.set()
    result = writer.close(timeout_s=30)
    assert result["sent"] == 1 and result["unsent"] == 0 and not (tmp_path / "spool.jsonl").exists()
