"""The jsonl tracking backend: runs as files, safe with two writers, no MLflow."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tracking import TrackingSpec, open_backend, tracker_for
from tracking.jsonl import JsonlBackend, JsonlTracker


@pytest.fixture
def backend(tmp_path: Path) -> JsonlBackend:
    b = open_backend("jsonl", None, tmp_path)
    assert isinstance(b, JsonlBackend)
    return b


def start(backend: JsonlBackend, name: str = "r1", **kw) -> tuple[TrackingSpec, bool]:
    return backend.start_run("exp", name, kind="train", spool_path=Path("/nowhere/spool.jsonl"), **kw)


def run_json(backend: JsonlBackend, spec: TrackingSpec) -> dict:
    return json.loads((Path(backend.uri) / spec.experiment_id / spec.run_id / "run.json").read_text())


def test_uri_default_plain_and_file_scheme_resolve_to_absolute(tmp_path: Path, monkeypatch) -> None:
    assert JsonlBackend(None, tmp_path).uri == str(tmp_path.resolve() / "tracking")
    monkeypatch.chdir(tmp_path)
    assert JsonlBackend("rel/store", Path("/ignored")).uri == str(tmp_path.resolve() / "rel" / "store")
    assert JsonlBackend(f"file://{tmp_path}/s", Path("/ignored")).uri == str(tmp_path.resolve() / "s")


def test_start_finds_by_name_and_resumes(backend: JsonlBackend) -> None:
    backend.check()
    spec, resumed = start(backend, log_every_steps=5)
    assert not resumed and spec.backend == "jsonl" and spec.uri == backend.uri and spec.log_every_steps == 5
    assert len(spec.run_id) == 32
    other, _ = start(backend, "r2")
    assert other.run_id != spec.run_id
    backend.end_run(spec, "FAILED")
    again, resumed = start(backend)
    assert resumed and again.run_id == spec.run_id
    assert run_json(backend, again)["status"] == "RUNNING"


def test_params_tags_metrics_round_trip(backend: JsonlBackend) -> None:
    spec, _ = start(backend)
    w = backend.writer(spec)
    w.log_params({"lr": 0.1, "name": "mlp", "sizes": [1, 2]})
    w.log_params({"lr": 0.5})  # immutable: the first value stays
    w.set_tags({"world_size": 2, "resumed": False})
    w.log_metrics({"train_loss": 1.5, "nan": float("nan"), "flag": True, "text": "x", "acc": 3}, step=7)
    w.log_metrics({"train_loss": 1.0}, step=9)
    assert w.close() == {"sent": 9, "unsent": 0, "spool_path": None}
    run = run_json(backend, spec)
    assert run["params"] == {"lr": "0.1", "name": "mlp", "sizes": "[1, 2]"}
    assert run["tags"]["world_size"] == "2" and run["tags"]["resumed"] == "False"
    assert run["tags"]["elastic_train.run_name"] == "r1"
    assert backend.logged_params(spec) == {"lr", "name", "sizes"}
    lines = (Path(backend.uri) / "exp" / spec.run_id / "metrics.jsonl").read_text().splitlines()
    assert [(m["key"], m["value"], m["step"]) for m in map(json.loads, lines)] == [
        ("train_loss", 1.5, 7), ("acc", 3.0, 7), ("train_loss", 1.0, 9)]
    assert backend.last_logged_step(spec) == 9


def test_last_logged_step_without_metrics_and_with_a_torn_line(backend: JsonlBackend) -> None:
    spec, _ = start(backend)
    assert backend.last_logged_step(spec) == -1
    tracker_for(spec, 0).log_metrics({"val_loss": 1.0}, step=50)  # not train_loss
    assert backend.last_logged_step(spec) == -1
    path = Path(backend.uri) / "exp" / spec.run_id / "metrics.jsonl"
    path.write_text(path.read_text() + '{"key": "train_loss", "value": 1.0, "st')
    assert backend.last_logged_step(spec) == -1


def test_unless_logged_drops_steps_at_or_below_the_floor(backend: JsonlBackend) -> None:
    spec, _ = start(backend)
    first = tracker_for(spec, 0)
    assert isinstance(first, JsonlTracker)
    for step in (10, 20):
        first.log_metrics({"train_loss": float(step)}, step=step)
    second = tracker_for(spec, 0)  # a restarted worker
    second.skip_logged_steps(fallback=5)
    second.log_metrics({"train_loss": 0.0}, step=20, unless_logged=True)  # dropped: already logged
    second.log_metrics({"val_loss": 0.0}, step=15, unless_logged=True)  # dropped: below the floor
    second.log_metrics({"final": 1.0}, step=20)  # always kept
    second.log_metrics({"train_loss": 0.5}, step=30, unless_logged=True)
    lines = (first.run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [(m["key"], m["step"]) for m in map(json.loads, lines)]
    assert steps == [("train_loss", 10), ("train_loss", 20), ("final", 20), ("train_loss", 30)]


def test_skip_logged_steps_falls_back_when_the_run_cannot_be_read(tmp_path: Path) -> None:
    spec = TrackingSpec(uri=str(tmp_path), run_id="r", experiment_id="e", spool_path="", backend="jsonl")
    t = JsonlTracker(spec)
    (tmp_path / "e" / "r").mkdir(parents=True)
    (tmp_path / "e" / "r" / "metrics.jsonl").mkdir()  # a folder: reading it raises
    t.skip_logged_steps(fallback=12)
    (tmp_path / "e" / "r" / "metrics.jsonl").rmdir()
    t.log_metrics({"x": 1.0}, step=12, unless_logged=True)
    t.log_metrics({"x": 2.0}, step=13, unless_logged=True)
    lines = (tmp_path / "e" / "r" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [13]


def _writer(spec: TrackingSpec, who: str, n: int, go) -> None:
    t = JsonlTracker(spec)
    go.wait(60)  # both processes start writing together
    for i in range(n):
        t.log_metrics({f"{who}_a": float(i), f"{who}_b": float(i)}, step=i)
        t.set_tags({f"{who}.{i}": i})
        t.log_params({f"{who}.p{i}": i})


@pytest.mark.slow  # seconds of CPU: make test, not the one-minute make test-fast
def test_two_processes_writing_the_same_run_lose_nothing(backend: JsonlBackend) -> None:
    spec, _ = start(backend)
    ctx, n = multiprocessing.get_context("spawn"), 150
    go = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(spec, who, n, go)) for who in ("driver", "rank0")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = (Path(backend.uri) / "exp" / spec.run_id / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(line) for line in lines]  # every line whole
    assert len(metrics) == 4 * n
    for key in ("driver_a", "driver_b", "rank0_a", "rank0_b"):
        assert sorted(m["step"] for m in metrics if m["key"] == key) == list(range(n))
    run = run_json(backend, spec)
    assert {f"{w}.{i}" for w in ("driver", "rank0") for i in range(n)} <= set(run["tags"])
    assert len(run["params"]) == 2 * n and run["name"] == "r1" and run["status"] == "RUNNING"


def test_child_runs_and_end_run_status(backend: JsonlBackend) -> None:
    parent, _ = start(backend, "sweep")
    a, _ = start(backend, "trial_0", parent_run_id=parent.run_id)
    b, _ = start(backend, "trial_1", parent_run_id=parent.run_id)
    start(backend, "unrelated")
    same_name_elsewhere, resumed = start(backend, "trial_0")  # no parent: a different run
    assert not resumed and same_name_elsewhere.run_id != a.run_id
    backend.end_run(a, "FINISHED")
    backend.end_run(b, "KILLED")
    children = {c.name: (c.run_id, c.status) for c in backend.child_runs(parent)}
    assert children == {"trial_0": (a.run_id, "FINISHED"), "trial_1": (b.run_id, "KILLED")}
    run = run_json(backend, a)
    assert run["end_time"] >= run["start_time"] and run["parent_run_id"] == parent.run_id


def test_model_round_trip_by_path_run_uri_and_registry(backend: JsonlBackend, tmp_path: Path) -> None:
    import torch

    spec, _ = start(backend)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(5, 4)
    (tmp_path / "tokenizer.json").write_text('{"kind": "bytes"}')
    out = backend.log_model(spec, model, x.numpy(), "digits", {"elastic_train": {"config": {"lr": 0.1}}},
                            [str(tmp_path / "tokenizer.json")])
    assert out == {"model_uri": f"runs:/{spec.run_id}/model", "registered_model": "models:/digits/1"}
    expected = model(x)
    torch.nn.init.zeros_(model[2].weight)  # the run logs a changed model again: version 1 must not change
    assert backend.log_model(spec, model, None, "digits", {"v": 2})["registered_model"] == "models:/digits/2"
    folder = Path(backend.uri) / "exp" / spec.run_id / "model"
    cases = [(out["model_uri"], model(x), "v"), (str(folder), model(x), "v"),
             ("models:/digits/1", expected, "elastic_train"), ("models:/digits/2", model(x), "v")]
    for uri, want, meta_key in cases:
        loaded, meta = backend.load_model(uri)
        assert meta["run_id"] == spec.run_id and meta_key in meta
        assert torch.equal(loaded(x), want)
    assert backend.load_model("models:/digits/1")[1]["elastic_train"] == {"config": {"lr": 0.1}}
    assert backend.load_model("models:/digits/1")[1]["extra_files"] == {"tokenizer.json": '{"kind": "bytes"}'}
    assert backend.load_model("models:/digits/2")[1]["extra_files"] == {}  # logged without one
    with pytest.raises(FileNotFoundError):
        backend.load_model("runs:/nosuchrun/model")


def test_artifacts_and_checkpoints_are_copied(backend: JsonlBackend, tmp_path: Path) -> None:
    spec, _ = start(backend)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.txt").write_text("B")
    backend.log_artifacts(spec, src)
    backend.log_artifacts(spec, src, "plots")
    tracker_for(spec, 0).log_checkpoint(str(src), "checkpoints/checkpoint_000001")
    art = Path(backend.uri) / "exp" / spec.run_id / "artifacts"
    assert (art / "a.txt").read_text() == "A" and (art / "sub" / "b.txt").read_text() == "B"
    assert (art / "plots" / "sub" / "b.txt").read_text() == "B"
    assert (art / "checkpoints" / "checkpoint_000001" / "a.txt").read_text() == "A"
    assert backend.checkpoint_copier(spec, ["last"], "val_loss", "min") is None


def test_environment_params(backend: JsonlBackend) -> None:
    import torch

    params = backend.environment_params()
    assert params["env.torch"] == torch.__version__ and params["env.python"].count(".") == 2
    assert "env.mlflow" not in params and params["env.host"]


@pytest.mark.subprocess
def test_using_the_backend_does_not_import_mlflow(tmp_path: Path) -> None:
    code = (
        "import sys, pathlib, torch, tracking.jsonl\n"
        "from tracking import open_backend, tracker_for\n"
        f"b = open_backend('jsonl', None, pathlib.Path({str(tmp_path)!r}))\n"
        "spec, _ = b.start_run('e', 'r', kind='train', spool_path=pathlib.Path('s'))\n"
        "t = tracker_for(spec, 0); t.log_metrics({'train_loss': 1.0}, step=1)\n"
        "t.set_tags({'a': 1}); t.close()\n"
        "b.log_model(spec, torch.nn.Linear(2, 2), None, 'm', {}); b.load_model('models:/m/1')\n"
        "b.end_run(spec, 'FINISHED'); b.child_runs(spec); b.environment_params()\n"
        "assert 'mlflow' not in sys.modules, 'mlflow was imported'\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize("kind", ["jsonl", pytest.param("mlflow", marks=pytest.mark.slow)])  # sqlite store: s
def test_a_run_is_found_by_name_and_storage_not_by_name_alone(tmp_path: Path, kind: str) -> None:
    """Two storages holding a run of the same name are two logical runs (the second trains from step 0): two
    tracking runs. The same storage again is a resume of the first."""
    if kind == "mlflow":
        pytest.importorskip("mlflow")
        from tracking.mlflow_backend import MlflowBackend

        b = MlflowBackend(f"sqlite:///{tmp_path}/mlflow.db", tmp_path)
    else:
        b = open_backend("jsonl", None, tmp_path)

    def go(storage: str | None) -> tuple[TrackingSpec, bool]:
        return b.start_run("exp", "same", kind="train", spool_path=tmp_path / "s.jsonl", storage=storage)

    first, resumed = go("/data/a")
    assert not resumed
    again, resumed = go("/data/a")
    assert resumed and again.run_id == first.run_id
    other, resumed = go("s3://bucket/a")
    assert not resumed and other.run_id != first.run_id
    anywhere, resumed = go(None)  # no storage given (a tool reading runs): one of that name
    assert resumed and anywhere.run_id in {first.run_id, other.run_id}
