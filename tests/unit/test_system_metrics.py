"""``tracking.system_metrics=true`` is the default, so its dependency (psutil) is installed and a run's worker
tracker records MLflow's ``system/*`` metrics (issue 34 item 10).
Real MLflow on a sqlite store; 25 s here under load (mostly imports and the store)."""

from __future__ import annotations

import time

import pytest

from elastic_train import config as config_mod
from tracking import open_backend

pytestmark = pytest.mark.slow


def test_a_default_run_records_system_metrics(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    from tracking.mlflow_tracker import MlflowTracker

    assert config_mod.load(None).tracking.system_metrics is True
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")  # MLflow's own knob: 10 s by default
    backend = open_backend("mlflow", None, tmp_path)
    spec, _ = backend.start_run("sysmetrics", "r", kind="train", spool_path=tmp_path / "spool.jsonl",
                                system_metrics=config_mod.load(None).tracking.system_metrics)
    tracker = MlflowTracker(spec)  # a worker's: it starts the monitor when the spec asks
    client = MlflowClient(tracking_uri=spec.uri)
    deadline, names = time.monotonic() + 30, set()
    while time.monotonic() < deadline and not any(n.startswith("system/cpu") for n in names):
        tracker.log_metrics({"train_loss": 1.0}, step=0)
        time.sleep(0.5)  # polling a real store for a background thread's write, bounded by the deadline
        names = set(client.get_run(spec.run_id).data.metrics)
    tracker.close(timeout_s=10)
    assert any(n.startswith("system/cpu") for n in names), sorted(names)
