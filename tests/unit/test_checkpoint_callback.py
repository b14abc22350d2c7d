"""The run's checkpoint copies into MLflow (tracking/checkpoints.py), made on the driver: nothing of them in Ray
Train's callbacks (the controller's hooks that saw each report are internal), nothing left behind, nothing lost
without a word."""

from __future__ import annotations

import threading

import pytest

from tracking.base import TrackingSpec
from tracking.checkpoints import CheckpointCopier


def test_the_copier_starts_its_thread_at_the_first_offer_and_nothing_before(tmp_path):
    spec = TrackingSpec(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", run_id="0" * 32, experiment_id="0",
                        spool_path=str(tmp_path / "unsent.jsonl"))
    before = {t.name for t in threading.enumerate()}
    copier = CheckpointCopier(spec, ["none"], "val_loss", "min")
    copier.offer(object(), {"val_loss": 1.0})  # nothing to copy: no thread, no MLflow client
    assert copier._thread is None and "mlflow-checkpoints" not in {t.name for t in threading.enumerate()} - before
    assert copier.finish(timeout_s=5)["unsent"] == 0


def test_a_run_hands_ray_train_no_tracking_callback(tmp_path):
    """The copies are the driver's: Ray Train's callbacks hold only the engine's own (none with the switch off)."""
    import time
    import types

    from elastic_train import config
    from elastic_train.launch.trainer import build_trainer
    from elastic_train.train.warmup import WorkerWarmup

    cfg = config.compose({}, config.parse_overrides([]))
    ctx = types.SimpleNamespace(cfg=cfg, run_name="c", storage_path=str(tmp_path), use_gpu=False, tracking=None,
                                fault=None, started=time.time(), embedded_ray=False)
    assert {type(c) for c in build_trainer(ctx).run_config.callbacks} <= {WorkerWarmup}


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
    copier = CheckpointCopier(spec, ["all", "best", "last"], "val_loss", "min")
    for i, checkpoint in enumerate(checkpoints):
        copier.offer(checkpoint, {"val_loss": 1.0 / (i + 1)})
    result = copier.finish(timeout_s=120)
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
