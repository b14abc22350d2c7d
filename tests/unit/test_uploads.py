"""At most one checkpoint upload in flight per rank: the next checkpoint waits for the previous upload, and the
worst lag behind durable storage is what training had run ahead when a checkpoint landed (issue 51 item 11).
Real threads: the upload thread is a thread, as Ray Train's is."""

from __future__ import annotations

import threading

import pytest

from elastic_train.train.uploads import Uploads, UploadTimeout


def test_the_next_checkpoint_waits_for_the_previous_upload_and_the_lag_is_measured():
    step = {"now": 10}
    uploads = Uploads()
    uploads.start(lambda: step["now"], restored_step=10)
    assert uploads.before_report("checkpoint_12", 12) < 0.1  # nothing in flight: no wait
    step["now"] = 14
    waiting = threading.Event()
    reported = threading.Event()

    def next_checkpoint():
        waiting.set()
        uploads.before_report("checkpoint_14", 14)
        reported.set()

    t = threading.Thread(target=next_checkpoint)
    t.start()
    assert waiting.wait(10)
    assert not reported.wait(0.3)  # still waiting: checkpoint_12 is in flight
    step["now"] = 14  # training stopped at 14, waiting; checkpoint_12 lands: 4 steps ahead of step 10 at worst
    uploads.finished("checkpoint_12", ok=True)
    assert reported.wait(10)
    t.join(10)
    uploads.finished("checkpoint_14", ok=True)  # 14 - 12: 2 steps
    d = uploads.take()
    assert d.uploads == 2 and d.worst_behind_steps == 4 and d.upload_s > 0


def test_a_failed_upload_ends_the_wait_and_a_stuck_one_ends_in_a_clear_error():
    uploads = Uploads(wait_bound_s=0.5)
    uploads.before_report("checkpoint_2", 2)
    uploads.finished("checkpoint_2", ok=False)  # the attempt fails through Ray Train; nothing waits on it
    assert uploads.before_report("checkpoint_4", 4) < 0.1 and uploads.take().uploads == 0
    with pytest.raises(UploadTimeout, match="checkpoint_6: the upload of checkpoint_4 did not finish within 0.5 s"):
        uploads.before_report("checkpoint_6", 6)
