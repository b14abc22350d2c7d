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


def test_a_run_shorter_than_the_sampling_interval_records_a_sample(tmp_path, monkeypatch):
    """MLflow's monitor samples every 10 s and, stopped sooner, logs nothing: a default run of a few seconds had no
    ``system/*`` metric at all (issue 51 item 7). The tracker publishes the monitor's last window when it closes."""
    from mlflow.tracking import MlflowClient

    from tracking.mlflow_tracker import MlflowTracker

    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", raising=False)  # MLflow's default: 10 s
    monkeypatch.delenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", raising=False)
    backend = open_backend("mlflow", None, tmp_path)
    spec, _ = backend.start_run("sysmetrics", "short", kind="train", spool_path=tmp_path / "spool.jsonl",
                                system_metrics=True)
    tracker = MlflowTracker(spec)
    started = time.monotonic()
    tracker.log_metrics({"train_loss": 1.0}, step=0)
    assert tracker.flush(timeout_s=30)  # connected (the monitor started) and sent
    assert tracker.close(timeout_s=10)["unsent"] == 0
    assert time.monotonic() - started < 10  # shorter than one sampling interval
    names = set(MlflowClient(tracking_uri=spec.uri).get_run(spec.run_id).data.metrics)
    assert any(n.startswith("system/cpu") for n in names), sorted(names)
