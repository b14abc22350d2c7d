"""The MLflow checkpoint callback starts its sender only on the Train controller, never in a worker.

Ray Train hands every worker the run config, callbacks included: a callback that started its thread when
unpickled made each worker import MLflow and run a sender thread beside training (issue 13, seen with py-spy).
"""

from __future__ import annotations

import pickle
import threading

import pytest

from tracking.base import TrackingSpec
from tracking.checkpoints import MlflowCheckpointCallback


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.is_alive()}


@pytest.mark.slow  # seconds of CPU: make test, not the one-minute make test-fast
def test_unpickling_starts_nothing_and_the_training_start_does(tmp_path):
    spec = TrackingSpec(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", run_id="0" * 32, experiment_id="0",
                        spool_path=str(tmp_path / "unsent.jsonl"))
    before = _threads()
    clone = pickle.loads(pickle.dumps(MlflowCheckpointCallback(spec, ["best", "last"], "val_loss", "min")))
    assert clone._thread is None  # as a worker sees it: no thread, no MLflow import
    assert "mlflow-checkpoints" not in _threads() - before

    clone.after_controller_start(None)  # before the workers start: not yet (their start-up keeps the CPU)
    assert clone._thread is None
    clone.after_worker_group_training_start(None)  # what the controller calls once they run the train function
    assert clone._thread is not None and clone._thread.is_alive()
    assert clone.flush(timeout_s=60)["unsent"] == 0
    assert not clone._thread.is_alive()


def test_nothing_to_copy_starts_no_thread_even_on_the_controller(tmp_path):
    spec = TrackingSpec(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", run_id="0" * 32, experiment_id="0",
                        spool_path=str(tmp_path / "unsent.jsonl"))
    clone = pickle.loads(pickle.dumps(MlflowCheckpointCallback(spec, ["none"], "val_loss", "min")))
    clone.after_worker_group_training_start(None)
    assert clone._thread is None


def _checkpoints(root, n: int) -> list:
    """``n`` small checkpoint folders as the run's storage holds them (meta.json names its step)."""
    import json

    from ray.train import Checkpoint

    out = []
    for i in range(n):
        d = root / f"checkpoint_{i:09d}"
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(bytes(1024))
        (d / "meta.json").write_text(json.dumps({"step": i}))
        out.append(Checkpoint(str(d)))
    return out


@pytest.mark.slow  # a real MLflow store and 50 copies: seconds
def test_fifty_checkpoints_leave_no_copy_behind_and_a_failed_copy_is_said_once_and_counted(tmp_path, monkeypatch,
                                                                                            caplog):
    """Every copy for MLflow was an mkdtemp folder nobody removed (534 in a day's /tmp), and a copy that failed
    returned without a word (issue 51 item 2). Fifty checkpoints, each a new best, every one copied
    (``log_checkpoints=[all, best, last]``); the 26th is gone from storage before the copy (Ray's retention can do
    that): one warning, counted as unsent; nothing left in the temp folder nor beside the run's spool;
    checkpoints/last is the 50th."""
    import json
    import tempfile
    from types import SimpleNamespace

    from mlflow.tracking import MlflowClient

    from tracking import open_backend

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where mkdtemp puts its folders
    backend = open_backend("mlflow", None, tmp_path)
    spec, _ = backend.start_run("ckpts", "fifty", kind="train", spool_path=tmp_path / "run" / "mlflow_unsent.jsonl")
    checkpoints = _checkpoints(tmp_path / "storage", 50)
    gone = checkpoints[25]
    import shutil

    shutil.rmtree(gone.path)
    callback = MlflowCheckpointCallback(spec, ["all", "best", "last"], "val_loss", "min")
    for i, checkpoint in enumerate(checkpoints):
        callback.after_report(SimpleNamespace(checkpoint=checkpoint), [{"val_loss": 1.0 / (i + 1)}])
    result = callback.flush(timeout_s=120)
    warned = [r for r in caplog.records if "checkpoint_000000025" in r.getMessage()]
    assert len(warned) == 1 and warned[0].levelname == "WARNING", [r.getMessage() for r in caplog.records]
    assert result["unsent"] == 1, result
    assert list(tmp.iterdir()) == [], list(tmp.iterdir())  # no copy left in the temp folder
    leftovers = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and p.name != "elastic_train.log"]
    assert leftovers == [], leftovers  # nor beside the spool: every copy was sent
    client = MlflowClient(tracking_uri=spec.uri)
    last = json.loads(open(client.download_artifacts(spec.run_id, "checkpoints/last/meta.json",
                                                     str(tmp_path / "dl"))).read())
    assert last == {"step": 49}
    assert client.get_run(spec.run_id).data.tags["best_checkpoint"] == "checkpoint_000000049"
    copied = {a.path for a in client.list_artifacts(spec.run_id, "checkpoints")}
    assert len(copied) == 49 + 2 and "checkpoints/checkpoint_000000025" not in copied  # all but the gone one
