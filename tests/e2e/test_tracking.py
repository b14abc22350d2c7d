"""MLflow tracking against a real `mlflow server` on 127.0.0.1 (started with `python -m tracking.server`)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.cluster.test_elastic import wait_for
from tests.conftest import tiny
from tests.e2e.conftest import free_ports
from tests.helpers.mlflow_server import MlflowServer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """One server for the module's tests that track to one (different run names): the killed-worker run, then the
    outage, which stops it and starts it again on the same port and store."""
    server = MlflowServer(tmp_path_factory.mktemp("mlflow"))
    yield server.start(timeout_s=90)
    server.stop()


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _runs_named(uri: str, name: str):
    client = _client(uri)
    exp = client.get_experiment_by_name("elastic-train")
    return client.search_runs([exp.experiment_id], filter_string=f"tags.`elastic_train.run_name` = '{name}'")


def _run(home: Path, name: str, uri: str, *overrides: str) -> dict:
    from jobs import train

    summary = home / f"{name}.json"
    rc = train.main(["--config", "configs/digits.yaml",
                     *tiny(f"name={name}", f"tracking.uri={uri}", f"checkpoint.storage_path={home}", *overrides),
                     "--summary-json", str(summary)])
    assert rc == 0
    return json.loads(summary.read_text())


def test_a_killed_worker_still_gives_one_complete_run(ray_session, home, mlflow_server, monkeypatch):
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"step=13,rank=1,marker={home / 'fired'}")
    s = _run(home, "tracked", mlflow_server.uri, "checkpoint.every_steps=5", "tracking.log_every_steps=2",
             "tracking.register_model=digits-mlp")
    assert s["registered_model"] == "models:/digits-mlp/1"
    assert s["restarts"] == 1
    runs = _runs_named(mlflow_server.uri, "tracked")
    assert len(runs) == 1 and runs[0].info.run_id == s["mlflow_run_id"] and runs[0].info.status == "FINISHED"
    run = runs[0]
    assert run.data.params["train.global_batch_size"] == "128" and "env.torch" in run.data.params
    client = _client(mlflow_server.uri)
    history = client.get_metric_history(run.info.run_id, "train_loss")
    steps = [m.step for m in sorted(history, key=lambda m: m.timestamp)]
    assert steps == sorted(steps), "the step axis went backwards after the restart"
    expected = {k for k in range(1, 23) if k % 2 == 0 or k % 11 == 0 or k % 5 == 0}
    assert expected <= set(steps), f"missing train_loss points: {sorted(expected - set(steps))}"
    assert client.get_metric_history(run.info.run_id, "restarts")[-1].value == 1
    import mlflow

    from tracking.mlflow_tracker import _with_tracking_uri

    # MLflow 3: the model is a LoggedModel linked to the run
    model_info = _with_tracking_uri(mlflow_server.uri, lambda: mlflow.models.get_model_info(s["model_uri"]))
    assert model_info.run_id == run.info.run_id and model_info.signature is not None
    assert model_info.metadata["elastic_train"]["run_name"] == "tracked"
    ckpts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert {"checkpoints/best", "checkpoints/last"} <= ckpts
    assert "meta.json" in {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "checkpoints/last")}
    # the run's *final* checkpoint, uploaded before the run ended (the controller's end-of-run flush)
    last = json.loads(Path(client.download_artifacts(run.info.run_id, "checkpoints/last/meta.json",
                                                     str(home))).read_text())
    assert last["progress"]["global_step"] == s["steps"]

    # the logged model alone reproduces the run's final validation accuracy, on 2 workers
    from jobs import evaluate

    out = home / "eval.json"
    assert evaluate.main(["--model", "models:/digits-mlp/1", f"tracking.uri={mlflow_server.uri}",
                          "--summary-json", str(out)]) == 0
    ev = json.loads(out.read_text())
    assert ev["metrics"]["val_accuracy"] == pytest.approx(s["final_metrics"]["val_accuracy"], abs=1e-12)
    assert ev["source_run_id"] == run.info.run_id and ev["metrics"]["world_size"] == 2


def test_the_server_goes_away_mid_run_and_nothing_is_lost(ray_session, home, mlflow_server, monkeypatch):
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", "delay=0.1")  # ~9 s of training: room for an outage
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("s", _run(
        home, "outage", mlflow_server.uri, "train.global_batch_size=32", "tracking.log_every_steps=1")), daemon=True)
    worker.start()
    # Ray Train's report() carries no metrics to us; watch the checkpoints' meta.json for progress instead.
    wait_for(lambda: _logged_steps(mlflow_server.uri, "outage") >= 5, 180, "the first metrics to reach the server")
    mlflow_server.stop()
    wait_for(lambda: _checkpoint_steps(home / "outage") >= 44, 120, "training to go on without the server")
    mlflow_server.start()
    worker.join(timeout=300)
    assert not worker.is_alive()
    s = result["s"]
    assert s["status"] == "FINISHED" and s["tracking_unsent"] == 0
    client = _client(mlflow_server.uri)
    steps = {m.step for m in client.get_metric_history(s["mlflow_run_id"], "train_loss")}
    assert steps == set(range(1, s["steps"] + 1)), f"lost steps: {sorted(set(range(1, s['steps'] + 1)) - steps)}"
    assert _runs_named(mlflow_server.uri, "outage")[0].info.status == "FINISHED"


def _logged_steps(uri: str, name: str) -> int:
    try:
        runs = _runs_named(uri, name)
        history = _client(uri).get_metric_history(runs[0].info.run_id, "train_loss") if runs else []
    except Exception:  # not created yet
        return 0
    return len(history)


def _checkpoint_steps(run_dir: Path) -> int:
    steps = [json.loads(m.read_text())["progress"]["global_step"] for m in run_dir.glob("checkpoint_*/meta.json")]
    return max(steps, default=0)


def test_unreachable_server_exits_2_unless_tracking_is_optional(ray_session, home):
    from jobs import train

    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    argv = ["--config", "configs/digits.yaml", *tiny(f"tracking.uri={dead}", f"checkpoint.storage_path={home}",
                                                     "train.epochs=1")]
    assert train.main(argv) == 2
    out = home / "s.json"
    assert train.main([*argv, "tracking.required=false", "--summary-json", str(out)]) == 0
    assert json.loads(out.read_text())["mlflow_run_id"] is None


def test_basic_auth_refuses_anonymous_logging_and_accepts_credentials(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    server = MlflowServer(tmp_path / "auth", basic_auth=True)
    server.start()
    try:
        monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
        monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
        with pytest.raises(MlflowException, match="401|Unauthorized|credentials"):
            _client(server.uri).create_experiment("anonymous")
        from tracking.runs import TrackingUnavailable, check_reachable

        with pytest.raises(TrackingUnavailable, match="credentials"):
            check_reachable(server.uri)
        monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
        monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server.password)
        check_reachable(server.uri)
        client = _client(server.uri)
        exp = client.create_experiment("with-credentials")
        run = client.create_run(exp)
        client.log_metric(run.info.run_id, "x", 1.0, step=3)
        assert client.get_metric_history(run.info.run_id, "x")[0].step == 3
    finally:
        server.stop()
