"""Real gloo DDP through TorchTrainer with 2 workers on the real digits preset, shrunk."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from elastic_train.train.goodput import WALL_PARTS
from elastic_train.train.state import load_model
from tests.distributed.conftest import run_job
from tests.helpers.worker_logs import WorkerLogs

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def runs(ray_module, session_home, tmp_path_factory):
    """The uninterrupted 2-worker run the other tests compare against (shared: each run costs ~15 s)."""
    import os

    from tests.conftest import traced

    os.environ["ELASTIC_TRAIN_HOME"] = str(session_home)
    tmp = tmp_path_factory.mktemp("ddp")
    with traced("digits"):  # one of the default-path runs whose private names are counted (test_job_submit.py)
        two = run_job(tmp, "two", "scaling.num_workers=2", "checkpoint.every_steps=5")
    return tmp, two


def assert_wall_adds_up(summary: dict) -> None:
    """Goodput counts the whole wall (DESIGN invariant 9): named parts add up to it; nothing is negative."""
    g, wall = summary["goodput"], summary["wall_s"]
    assert wall > 0 and g["wall_s"] == wall
    assert all(g[k] >= 0 for k in WALL_PARTS), g
    assert sum(g[k] for k in WALL_PARTS) == pytest.approx(wall, abs=0.05)
    assert g["other_s"] <= 0.05 * wall + 0.5, g  # the named parts cover the wall, not a catch-all
    assert g["goodput_ratio"] == pytest.approx(g["productive_s"] / wall)
    assert sum(summary["startup"].values()) == pytest.approx(g["startup_s"], abs=0.05), summary["startup"]
    assert sum(summary["teardown"].values()) == pytest.approx(g["teardown_s"], abs=0.05), summary["teardown"]
    phases = [*summary["startup"].values(), *summary["teardown"].values()]
    assert all(v >= 0 for v in phases), summary
    # None (nothing trained) or inside the wall, after start-up (the first step itself is productive)
    first = summary["time_to_first_step_s"]
    assert first is None or g["startup_s"] <= first <= wall, summary


@pytest.mark.versions
def test_two_workers_train_and_aggregate_metrics_over_both(runs):
    tmp, two = runs
    assert_wall_adds_up(two)
    assert two["goodput"]["startup_s"] > 0 and two["goodput"]["teardown_s"] > 0
    assert two["goodput"]["startup_s"] < two["time_to_first_step_s"]  # the first step itself is productive
    assert two["status"] == "FINISHED" and two["world_sizes"] == [2] and two["restarts"] == 0
    assert two["steps"] == 2 * (1438 // 128) and two["epochs"] == 2
    assert two["final_metrics"]["val_accuracy"] > 0.7
    assert two["samples_per_second"] > 0 and two["time_to_first_step_s"] > 0 and two["wall_s"] > 0
    # val metrics are sums all-reduced over both workers' shards: recompute them over the whole set
    from elastic_train.config import load
    from elastic_train.data import build_data

    model, cfg, meta = load_model(two["checkpoint"])
    bundle = build_data(cfg)
    with torch.no_grad():
        logits = model(bundle.val.x)
    acc = (logits.argmax(1) == bundle.val.y).sum().item() / len(bundle.val.y)
    loss = torch.nn.functional.cross_entropy(logits, bundle.val.y).item()
    assert two["final_metrics"]["val_accuracy"] == pytest.approx(acc, abs=1e-9)
    assert two["final_metrics"]["val_loss"] == pytest.approx(loss, rel=1e-5)
    assert load(None).model.name == "mlp" and meta["progress"]["epoch"] == 2


def test_loss_falls(runs):
    tmp, two = runs
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=two["tracking_uri"]).get_metric_history(two["mlflow_run_id"], "train_loss")
    losses = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert len(losses) >= 2 and losses[-1] < 0.7 * losses[0]


def test_one_and_two_workers_give_the_same_train_loss(runs):
    tmp, two = runs
    one = run_job(tmp, "one", "scaling.num_workers=1", "checkpoint.every_steps=5")
    assert one["world_sizes"] == [1]
    a, b = one["final_metrics"]["train_loss"], two["final_metrics"]["train_loss"]
    assert abs(a - b) / abs(b) < 1e-4, (a, b)


@pytest.mark.long  # `make test-long`; make test runs the same worker kinds (a pair closer than a checkpoint
# interval, a death in a save) as campaign seed 5 (tests/cluster/test_chaos.py), bitwise against the reference
def test_three_faults_of_three_kinds_end_bitwise_equal_and_exactly_once(runs, monkeypatch):
    """A fixed fault campaign (the short form of bench/chaos.py): rank 1's process dies at step 8, rank 0 raises
    at step 9 (closer than one checkpoint interval: both restarts resume from step 5), rank 1 dies inside the
    checkpoint save at step 15 (never reported: resume from 10). The run ends bitwise equal to the uninterrupted
    one, every epoch saw every sample once, and MLflow holds every step's metrics once."""
    from mlflow.tracking import MlflowClient

    from tests.helpers.trace import exactly_once_problems, read_trace

    tmp, two = runs
    markers, trace = tmp / "faults", tmp / "crashed-trace"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"step=8,rank=1,mode=exit; step=9,rank=0,mode=raise; "
                                              f"step=12,rank=1,mode=save; markers={markers}")
    crashed = run_job(tmp, "faults3", "scaling.num_workers=2", "checkpoint.every_steps=5", "failure.max_failures=5",
                      f"data.trace_path={trace}")
    fired = sorted(json.loads(p.read_text())["step"] for p in markers.glob("fault-*.json"))
    assert fired == [8, 9, 15], fired
    assert crashed["restarts"] == 3 and crashed["world_sizes"] == [2]
    records = read_trace(trace)
    served_again = sum(1 for r in records if r["rank"] == 0) - crashed["steps"]  # rank 0 fetched these twice
    assert served_again >= 3  # each fault lost at least its own step
    # The ledger knows the last step to within its 0.25 s push period, so on these millisecond steps it may
    # count fewer (none, when a restart resumes from the checkpoint complete on storage that the ledger's last
    # push came from); never more than were served again.
    assert 0 <= crashed["goodput"]["recomputed_steps"] <= served_again
    assert crashed["goodput"]["restart_lost_s"] > 0
    assert_wall_adds_up(crashed)
    assert crashed["params_sha256"] == two["params_sha256"]
    assert exactly_once_problems(records, n_train=1438, g=128, epochs=2) == []
    history = MlflowClient(tracking_uri=crashed["tracking_uri"]).get_metric_history(crashed["mlflow_run_id"],
                                                                                    "train_loss")
    steps = [m.step for m in history]
    assert len(steps) == len(set(steps)) and max(steps) == crashed["steps"]
    # retention held across the three restarts (issue 51 item 1): storage keeps what Ray Train's retention keeps
    from tests.distributed.test_retention import SNAPSHOT, assert_only_retained

    folders = {p.name for p in (tmp / "faults3").glob("checkpoint_*") if p.is_dir()}
    assert_only_retained(folders, json.loads((tmp / "faults3" / SNAPSHOT).read_text()), keep=2,
                         final=Path(crashed["checkpoint"]).name)


@pytest.mark.versions
def test_a_killed_worker_restarts_on_warm_spares_and_ends_bitwise_equal(runs, monkeypatch):
    """failure.spare_workers=auto (the default): from failure.spares_after_s into training (0 here) its node
    keeps a warm spare process per worker (train/spares.py). Rank 1 dies once they are warm: both new workers
    are processes that existed before the fault (none was started for the restart), and the run ends bitwise
    equal to the uninterrupted one."""
    tmp, two = runs
    markers = tmp / "spare-markers"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"step=8,rank=1,when=spares-warm; markers={markers}")
    run = run_job(tmp, "spares", "scaling.num_workers=2", "checkpoint.every_steps=5", "failure.spares_after_s=0")
    assert run["restarts"] == 1 and run["params_sha256"] == two["params_sha256"]
    from elastic_train.compat import features

    if not (features.enabled("warm_spares") and features.enabled("worker_warmup")):
        return  # internals off (make test-public): no spares, and no worker callback to mark where a worker began
    fault = json.loads((markers / "fault-0.json").read_text())
    records = [json.loads(line) for f in markers.glob("phases.rank*.jsonl") for line in f.read_text().splitlines()]
    new = [r for r in records if r["event"] == "context" and r["unix"] > fault["unix"]]
    assert len(new) == 2, new
    assert all(r["process_start"] < fault["unix"] for r in new), (fault, new)


def test_auto_checkpoint_interval_is_chosen_from_the_first_measured_checkpoint_and_summarised(runs):
    """checkpoint.every_steps=auto with a prior (issue 35): nothing chosen before the first measured checkpoint
    (the epoch end at step 11), then the Young-Daly interval from its cost, the step time and the posterior MTBF
    (the run's wall, mostly start-up, outweighs a 2 s prior: no failure in it), proposed by rank 0 and broadcast
    at the next sync point (a disagreement between ranks would hang the all-reduce: the run finishing says it did
    not), in the summary and in MLflow. ~15 s (one 2-worker run)."""
    import math

    from mlflow.tracking import MlflowClient

    tmp, _ = runs
    # no spares: a start on warm spares left by an earlier test shortens the start-up this test counts on
    auto = run_job(tmp, "auto", "scaling.num_workers=2", "checkpoint.every_steps=auto", "failure.mtbf_s=2",
                   "checkpoint.min_every_steps=3", "tracking.log_every_steps=1", "failure.spare_workers=0")
    assert auto["status"] == "FINISHED" and auto["steps"] == 22
    c = auto["checkpoint_interval"]
    assert c["changes"] == 1 and c["prior_mtbf_s"] == 2.0 and c["workers"] == 2 and c["restarts"] == 0
    assert c["mtbf_s"] == pytest.approx(2.0 / 2 + c["wall_s"])  # one pseudo-failure over 1 s, plus the wall
    assert c["interval_s"] == pytest.approx(math.sqrt(2 * c["checkpoint_cost_s"] * c["mtbf_s"]))
    assert c["every_steps"] == max(3, round(c["interval_s"] / c["step_s"]))
    assert auto["goodput_run"]["auto_every_steps"] == c["every_steps"] and auto["goodput_run"]["checkpoints"] >= 1
    history = MlflowClient(tracking_uri=auto["tracking_uri"]).get_metric_history(auto["mlflow_run_id"],
                                                                                 "checkpoint_auto_every_steps")
    assert [(m.step, m.value) for m in history] == [(11, float(c["every_steps"]))]


def test_rerunning_a_finished_run_trains_nothing(runs):
    tmp, two = runs
    again = run_job(tmp, "two", "scaling.num_workers=2", "checkpoint.every_steps=5")
    assert again["status"] == "FINISHED" and "already complete" in again.get("note", "")
    assert again["time_to_first_step_s"] is None and again["goodput"]["productive_s"] == 0  # was -22.1 s
    assert_wall_adds_up(again)
    assert again["checkpoint"] == two["checkpoint"]
    assert json.loads((tmp / "two.json").read_text())["params_sha256"] == two["params_sha256"]


def test_driver_killed_then_resumed_ends_bitwise_equal_and_in_one_mlflow_run(runs, ray_session):
    """Kill the whole driver mid-run (SIGKILL), then ``--resume NAME``: same parameters, same MLflow run.

    Ray Train's registry of checkpoints (its snapshot file) is removed before the resume, as if the controller had
    died before registering any: the workers resume from the newest checkpoint complete on storage instead."""
    import os
    import signal
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from elastic_train.launch.storage import SNAPSHOT_FILE
    from tests.cluster.test_elastic import wait_for
    from tests.conftest import ROOT, tiny

    tmp, two = runs
    env = dict(os.environ, RAY_ADDRESS=ray_session.get_runtime_context().gcs_address,
               ELASTIC_TRAIN_FAULT="delay=0.25")  # ~5 s of training: time to kill it mid-run
    argv = [sys.executable, "-m", "jobs.train", "--config", "configs/digits.yaml",
            *tiny("name=killed", f"checkpoint.storage_path={tmp}", "scaling.num_workers=2", "checkpoint.every_steps=5")]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        snapshot = tmp / "killed" / SNAPSHOT_FILE
        wait_for(lambda: snapshot.exists() and "checkpoint_000000010" in snapshot.read_text(), 180,
                 "the killed run's step-10 checkpoint to be committed")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    snapshot.unlink()
    from jobs import train

    # Rank 0 says where it resumed from on its stdout. Ray forwards that to the driver's console asynchronously
    # (it may arrive after main() returns), so the test reads the worker's own log file, written before it exits.
    logs = WorkerLogs(ray_session)
    assert train.main(
        ["--resume", "killed", f"checkpoint.storage_path={tmp}", "--summary-json", str(tmp / "r.json")]
    ) == 0
    resumed = json.loads((tmp / "r.json").read_text())
    assert re.search(r"checkpoint_0000000\d\d is complete on storage but Ray Train had not registered it",
                     logs.since())
    assert resumed["run_name"] == "killed" and resumed["restarts"] >= 1
    assert resumed["params_sha256"] == two["params_sha256"]
    runs_named = MlflowClient(tracking_uri=resumed["tracking_uri"]).search_runs(
        [MlflowClient(tracking_uri=resumed["tracking_uri"]).get_experiment_by_name("elastic-train").experiment_id],
        filter_string="tags.`elastic_train.run_name` = 'killed'")
    assert [r.info.run_id for r in runs_named] == [resumed["mlflow_run_id"]]
    assert runs_named[0].info.status == "FINISHED"


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["scaling.use_gpu=true"], "scaling.use_gpu"),  # more GPUs than the cluster has
        (["scaling.num_workers=9"], "scaling.num_workers"),  # more workers than fit (4 CPUs)
        (["scaling.resources_per_worker={CPU: 8}"], "scaling.resources_per_worker"),
        (["checkpoint.storage_path=/proc/elastic-train-cannot-write-here"], "checkpoint.storage_path"),
    ],
)
def test_preflight_refuses_what_the_cluster_cannot_do(ray_session, home, overrides, field, capsys):
    from jobs import train

    assert train.main(["--config", "configs/digits.yaml", *overrides, "train.global_batch_size=128"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}=")
