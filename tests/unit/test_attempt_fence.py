"""train/fence.py and its users: a worker group's attempt, claimed in run storage; a superseded attempt's
checkpoint, trace lines and metrics are refused, not merged (DESIGN invariant 12)."""

from __future__ import annotations

import json
import time

import pyarrow.fs
import pytest

from elastic_train.data.trace import Trace
from elastic_train.train.fence import AttemptFence, Superseded


def _fs():
    return pyarrow.fs.LocalFileSystem()


def test_each_worker_group_claims_the_next_attempt_and_an_older_one_is_refused(tmp_path):
    root = str(tmp_path / "run")
    first = AttemptFence.claim(_fs(), root)
    assert first.attempt == 1 and first.current() and first.may_write()
    first.check("checkpoint checkpoint_000000005")  # the newest: allowed
    second = AttemptFence.claim(_fs(), root)  # the run restarted without the first group
    assert second.attempt == 2 and second.current()
    assert not first.current() and not first.may_write() and first.superseded_by == 2
    with pytest.raises(Superseded, match="attempt 1 was superseded by attempt 2: checkpoint checkpoint_000000010"):
        first.check("checkpoint checkpoint_000000010")
    marker = json.loads((tmp_path / "run" / ".attempts" / "attempt-00000002").read_text())
    assert marker["attempt"] == 2 and marker["pid"] > 0


def test_the_watcher_turns_per_step_writes_off_once_a_newer_attempt_exists(tmp_path):
    root = str(tmp_path / "run")
    old = AttemptFence.claim(_fs(), root).watch(period_s=0.05)
    try:
        trace = Trace(str(tmp_path / "trace"), rank=0, world_size=2)
        trace.fence(old.attempt, old.may_write)
        trace.step(0, 0, [1, 2])
        AttemptFence.claim(_fs(), root)
        deadline = time.monotonic() + 10
        while old.may_write() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not old.may_write()
        trace.step(0, 1, [3, 4])  # refused: the run moved past this attempt
        trace.mark({"event": "late"})
        trace.close()
    finally:
        old.stop()
    lines = [json.loads(x) for x in (tmp_path / "trace.rank0").read_text().splitlines()]
    assert [(r["step"], r["attempt"], r["world_size"]) for r in lines] == [(0, 1, 2)]
    assert lines[0]["ids"] == [1, 2] and lines[0]["pid"] > 0


def test_a_listing_that_fails_keeps_per_step_writes_on(tmp_path):
    """An outage must not silence a live run: only a newer attempt, seen, turns writes off."""
    fence = AttemptFence(_fs(), str(tmp_path / "run"), 3)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".attempts").write_text("not a folder")  # listing it raises
    fence.watch(period_s=0.02)
    deadline = time.monotonic() + 10
    while fence.watched < 3 and time.monotonic() < deadline:  # three failed listings
        time.sleep(0.02)
    fence.stop()
    assert fence.watched >= 3
    assert fence.may_write() and fence.superseded_by is None


@pytest.mark.slow  # imports mlflow (seconds)
def test_a_superseded_sender_sends_nothing_more_and_spools_nothing(tmp_path):
    from mlflow.tracking import MlflowClient

    from tracking import TrackingSpec
    from tracking.mlflow_tracker import ATTEMPT_TAG, MlflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    exp = client.create_experiment("fence", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(exp).info.run_id

    def tracker(attempt: int) -> MlflowTracker:
        return MlflowTracker(TrackingSpec(uri=uri, run_id=run_id, experiment_id=exp, attempt=attempt,
                                          spool_path=str(tmp_path / f"unsent-{attempt}.jsonl")))

    old = tracker(1)
    old.log_metrics({"train_loss": 1.0}, step=1)
    assert old.flush(60)
    new = tracker(2)  # the run restarted elsewhere; its sender raises the tag
    new.log_metrics({"train_loss": 0.9}, step=2)
    assert new.flush(60)
    assert client.get_run(run_id).data.tags[ATTEMPT_TAG] == "2"
    old.log_metrics({"train_loss": 5.0}, step=3)  # the cut-off worker's sender, talking again
    old.flush(10)
    result = old.close(10)
    new.close(30)
    assert result["superseded_by"] == 2 and result["refused"] >= 1 and result["spool_path"] is None
    steps = sorted(m.step for m in client.get_metric_history(run_id, "train_loss"))
    assert steps == [1, 2]
    assert not (tmp_path / "unsent-1.jsonl").exists()
