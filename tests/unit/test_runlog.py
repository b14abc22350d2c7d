"""Nothing dropped in silence (issue 51 item 3): each ``except`` that lets something go writes what and why, once,
to the run's log file, not the console; where losing it changes a result, it says so where the result is.

The failures here are real: no Ray is running in this process, so every GCS call fails as it would with the GCS
away."""

from __future__ import annotations

import pytest

from elastic_train import runlog


@pytest.fixture
def run_log(tmp_path):
    path = runlog.attach(tmp_path / "run")
    yield path
    runlog.attach(tmp_path / "other")  # detach from this test's folder


def test_a_line_once_per_key_in_the_run_log_not_on_the_console(run_log, capfd):
    assert runlog.dropped("a thing", RuntimeError("because\nsecond line"))
    assert not runlog.dropped("a thing", RuntimeError("again"))  # said already
    text = run_log.read_text()
    assert text.count("dropped: a thing (RuntimeError: because)") == 1 and "again" not in text
    assert capfd.readouterr().err == ""


def test_a_goodput_book_storage_did_not_take_is_logged_and_flush_says_so(run_log, tmp_path):
    """Before: the sender's ``except Exception: pass`` dropped the book, and flush() said True, so the end of an
    attempt believed the driver would read its final book."""
    import pyarrow.fs

    from elastic_train.train.ledger import RunLedger, _Sender

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the run's folder should be")
    sender = _Sender()
    sender.post(RunLedger("k", (pyarrow.fs.LocalFileSystem(), str(blocked))), "book", b"x")
    assert sender.flush(10.0) is False
    assert "dropped: a goodput book for the run's ledger in storage (k.book)" in run_log.read_text()


def test_reservations_that_cannot_be_released_are_logged_once(run_log):
    """(release_stale_reservation is not called here: its ray.get_actor would start a Ray of its own.)"""
    import ray

    from elastic_train.launch.reservations import release_dead_runs_requests

    if ray.is_initialized():  # an earlier test's session Ray (tests/conftest.py starts it again on next use)
        ray.shutdown()

    assert release_dead_runs_requests() == [] and release_dead_runs_requests() == []  # a sweep's driver: every 2 s
    assert run_log.read_text().count("dropped: cancelling dead Train runs' resource requests") == 1

