"""Real Ray Tune sweeps on the session's local Ray: every trial is the real 2-worker DDP trainer on shrunk digits.

One ASHA sweep (4 grid trials, 2 epochs, an injected worker crash) is shared by most tests; a failing trial and
a driver killed mid-sweep then resumed run sweeps of their own.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs import sweep as sweep_job
from tests.cluster.test_elastic import wait_for
from tests.conftest import ROOT

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

PRESET = "configs/sweep-digits.yaml"
GRID = ("sweep.space={train.lr: {type: grid, values: [0.01, 0.00003]}, "
        "train.global_batch_size: {type: grid, values: [64, 128]}}")


def sweep_args(tmp: Path, name: str, *overrides: str) -> list[str]:
    """The real sweep preset, shrunk: tiny trials (2 epochs), no system-metrics thread, storage in ``tmp``."""
    return ["--config", PRESET, f"name={name}", f"checkpoint.storage_path={tmp}", "train.epochs=2",
            "tracking.system_metrics=false", "sweep.num_samples=1", *overrides]


def run_sweep(tmp: Path, name: str, *overrides: str, expect: int = 0) -> dict:
    summary = tmp / f"{name}.json"
    assert sweep_job.main([*sweep_args(tmp, name, *overrides), "--summary-json", str(summary)]) == expect
    return json.loads(summary.read_text())


def mlflow_client(summary: dict):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=summary["tracking_uri"])


def children(summary: dict) -> list:
    client = mlflow_client(summary)
    parent = client.get_run(summary["mlflow_parent_run_id"])
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")


def runs_named(summary: dict, name: str) -> list:
    client = mlflow_client(summary)
    exp = client.get_run(summary["mlflow_parent_run_id"]).info.experiment_id
    return client.search_runs([exp], filter_string=f"tags.`elastic_train.run_name` = '{name}'")


# ~60 s, once for the module's eight tests: a real 6-trial ASHA sweep of 2-worker trials on the session's Ray
@pytest.fixture(scope="module")
def asha(ray_module, session_home, tmp_path_factory):
    """A 4-trial ASHA grid sweep; the first trial to reach step 3 loses a worker once (its own budget recovers)."""
    os.environ["ELASTIC_TRAIN_HOME"] = str(session_home)
    tmp = tmp_path_factory.mktemp("sweep")
    marker = tmp / "fault-fired"
    os.environ["ELASTIC_TRAIN_FAULT"] = f"step=3,rank=1,marker={marker},mode=exit"
    console = Tee(sys.stdout)
    started = time.time()
    try:
        # The digits, built by a user function that counts its calls (tests/helpers/user_code.py).
        from tests.conftest import traced

        with contextlib.redirect_stdout(console), traced("sweep"):  # a default-path run (test_job_submit.py)
            summary = run_sweep(tmp, "asha", "sweep.search=grid", GRID, "sweep.scheduler=asha",
                                "sweep.grace_period=1", "sweep.reduction_factor=2",
                                "tracking.register_model=sweep-test-model",
                                "data.name=tests.helpers.user_code:counted_digits",
                                f"data.options={{count_path: {tmp / 'data-builds'}}}")
    finally:
        del os.environ["ELASTIC_TRAIN_FAULT"]
    (tmp / "console.txt").write_text(console.getvalue())
    (tmp / "window.json").write_text(json.dumps([started, time.time()]))  # when the sweep ran (the actor table)
    return tmp, summary, marker


class Tee(io.StringIO):
    """What the sweep printed (the driver's lines and the workers' lines Ray forwards), kept and passed on."""

    def __init__(self, out):
        super().__init__()
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(text)
        return super().write(text)


def test_a_sweep_prints_no_tune_banner(asha):
    """Tune's start banner and its TensorBoard hint stay off the console: the sweep prints its own header."""
    tmp, _, _ = asha
    console = (tmp / "console.txt").read_text()
    assert "trials at once: 1" in console  # the sweep's own header was captured
    for banner in ("Configuration for experiment", "View detailed results here", "tensorboard --logdir"):
        assert banner not in console, console


@pytest.mark.versions
def test_asha_sweep_completes_and_stops_weak_trials_early(asha):
    tmp, summary, _ = asha
    trials = summary["trials"]
    assert summary["status"] == "FINISHED" and len(trials) == 4
    assert summary["max_concurrent_trials"] == 1  # 4 CPUs / (1 trial driver + 2 workers x 1 CPU)
    stopped = [t for t in trials if t["status"] == "STOPPED"]
    finished = [t for t in trials if t["status"] == "FINISHED"]
    assert stopped and finished and len(stopped) + len(finished) == 4
    assert all(t["epochs"] == 1 for t in stopped) and all(t["epochs"] == 2 for t in finished)
    assert summary["total_epochs"] == sum(t["epochs"] for t in trials) < 12
    sign = 1 if summary["mode"] == "min" else -1
    ranked = [sign * t["best_metric"] for t in trials]
    assert ranked == sorted(ranked)


def test_every_trial_ran_the_real_multi_worker_trainer(asha):
    tmp, summary, marker = asha
    from elastic_train.launch.storage import RunStorage

    assert len(summary["trials"]) == 4, summary  # each one checked below
    for t in summary["trials"]:
        run = RunStorage(summary["storage_path"], t["run_name"])
        assert run.checkpoints(), t
        meta = json.loads(run.read_text(f"{run.checkpoints()[-1]}/meta.json"))
        assert meta["metrics"]["world_size"] == 2 and meta["config"]["train"]["lr"] == t["config"]["train.lr"]
        assert meta["config"]["train"]["global_batch_size"] == t["config"]["train.global_batch_size"]
    # Rank 0's own tags and metrics reach MLflow for every trial, the ones ASHA stopped included: their workers
    # were killed right after their last report, and their (niced) senders deliver as soon as they get the CPU.
    def complete(kid) -> bool:
        return kid.data.tags.get("world_size") == "2" and "val_loss" in kid.data.metrics

    # Bounded by the orphan's own bound (tracking/fence.py WAIT_S: 60 s to connect, 120 s to flush, a spool write):
    # 120 s timed out once in CI at a load where the asha sweep alone took 210 s.
    from tracking.fence import WAIT_S

    try:
        wait_for(lambda: len(kids := children(summary)) == 4 and all(map(complete, kids)), WAIT_S,
                 "every trial's rank-0 tags and metrics in MLflow", poll=1.0)
    except AssertionError as e:  # say which trial lacks what (a CI failure must be readable from its log)
        status = {t["run_name"]: (t["status"], t["restarts"]) for t in summary["trials"]}
        raise AssertionError(f"{e}: " + "; ".join(
            f"{k.data.tags.get('elastic_train.run_name')} {status.get(k.data.tags.get('elastic_train.run_name'))}"
            f" world_size={k.data.tags.get('world_size')} metrics={sorted(k.data.metrics)}"
            for k in children(summary) if not complete(k))
            + f"; spools: {[(str(p), len(p.read_text().splitlines())) for p in tmp.rglob('mlflow_unsent*')]}") from None
    kids = children(summary)
    # The injected crash hit one trial, which recovered within its own failure budget and went on.
    assert marker.exists()
    assert [k.data.metrics.get("restarts") for k in kids if k.data.metrics.get("restarts")] == [1.0]


@pytest.mark.versions
def test_mlflow_holds_one_parent_and_a_child_per_trial(asha):
    tmp, summary, _ = asha
    parents = runs_named(summary, "asha")
    assert [r.info.run_id for r in parents] == [summary["mlflow_parent_run_id"]]
    parent = parents[0]
    assert parent.data.tags["elastic_train.kind"] == "sweep" and parent.info.status == "FINISHED"
    kids = children(summary)
    assert sorted(k.data.tags["elastic_train.run_name"] for k in kids) == sorted(
        t["run_name"] for t in summary["trials"]
    )
    assert {k.data.tags["elastic_train.kind"] for k in kids} == {"trial"}
    assert {k.info.status for k in kids} == {"FINISHED"}
    # the sweep's driver opened every child run (sweep/runs.py): each trial was handed its run id in a file
    handoffs = {p.name.removesuffix(".json"): json.loads(p.read_text())["run_id"]
                for p in (Path(summary["storage_path"]) / "trial_runs").glob("trial-*.json")
                if not p.name.endswith(".summary.json")}
    assert handoffs == {k.data.tags["elastic_train.run_name"]: k.info.run_id for k in kids}
    assert all(k.inputs.dataset_inputs for k in kids)  # and recorded the sweep's dataset in each
    stopped = {t["run_name"] for t in summary["trials"] if t["status"] == "STOPPED"}
    assert {k.data.tags["elastic_train.run_name"] for k in kids if k.data.tags["stopped_early"] == "true"} == stopped
    names = {a.path for a in mlflow_client(summary).list_artifacts(parent.info.run_id)}
    assert {"results.csv", "sweep.png", "best_config.yaml", "summary.json", "best_checkpoint"} <= names
    assert parent.data.metrics["total_epochs"] == summary["total_epochs"]


def test_the_sweep_builds_its_data_once_and_every_trial_shares_one_object(asha):
    """Built once, on the sweep's driver (no trial or worker rebuilt it), and put in the object store once: every
    trial's child run names the same object."""
    tmp, summary, _ = asha
    assert (tmp / "data-builds").read_text().splitlines() == [str(os.getpid())]
    objects = {k.data.tags["data_object"] for k in children(summary)}
    assert len(objects) == 1 and "own" not in objects


def test_world_sizes_and_restarts_per_trial_in_summary_csv_and_child_runs(asha):
    import csv

    tmp, summary, _ = asha
    trials = {t["trial_id"]: t for t in summary["trials"]}
    assert all(t["world_sizes"] == [2] for t in trials.values())
    assert sorted(t["restarts"] for t in trials.values()) == [0] * 3 + [1]  # the injected crash, in one trial
    local = mlflow_client(summary).download_artifacts(summary["mlflow_parent_run_id"], "results.csv", str(tmp))
    table = list(csv.DictReader(Path(local).open()))
    assert {r["trial_id"]: (r["world_sizes"], int(r["restarts"])) for r in table} == {
        i: ("2", t["restarts"]) for i, t in trials.items()}
    tags = {k.data.tags["trial_id"]: (k.data.tags["world_sizes"], k.data.tags["restarts"]) for k in children(summary)}
    assert tags == {i: ("[2]", str(t["restarts"])) for i, t in trials.items()}


def test_best_is_one_trial_value_and_checkpoint_everywhere(asha):
    """Summary, results.csv, the parent run's tags and metric, best_config.yaml, best_checkpoint and the registered
    model all name the same trial, value, epoch and checkpoint: the trial's best checkpoint."""
    import csv

    from tracking.models import load_logged_model

    tmp, summary, _ = asha
    best, client = summary["best"], mlflow_client(summary)
    assert best["trial_id"] == summary["trials"][0]["trial_id"] and best["rule"] == "best checkpoint"
    meta = json.loads((Path(best["checkpoint"]) / "meta.json").read_text())
    assert (meta["metrics"]["val_loss"], meta["metrics"]["epoch"], meta["metrics"]["global_step"]) == (
        best["metric"], best["epoch"], best["step"])
    parent = client.get_run(summary["mlflow_parent_run_id"])
    assert (parent.data.tags["best_trial"], parent.data.tags["best_checkpoint"]) == (best["trial_id"],
                                                                                      best["checkpoint"])
    assert float(parent.data.tags["best_value"]) == pytest.approx(best["metric"], rel=1e-3)
    assert float(parent.data.tags["best_epoch"]) == best["epoch"]
    assert parent.data.metrics["best_val_loss"] == pytest.approx(best["metric"], rel=1e-12)
    local = client.download_artifacts(parent.info.run_id, "results.csv", str(tmp))
    first = next(csv.DictReader(Path(local).open()))
    assert (first["trial_id"], first["checkpoint"]) == (best["trial_id"], best["checkpoint"])
    assert float(first["best_val_loss"]) == pytest.approx(best["metric"], rel=1e-12)
    local = client.download_artifacts(parent.info.run_id, "best_checkpoint/meta.json", str(tmp / "dl"))
    assert json.loads(Path(local).read_text())["metrics"]["global_step"] == best["step"]
    _, model_meta = load_logged_model(best["registered_model"], summary["tracking_uri"])
    assert model_meta["elastic_train"]["checkpoint"] == best["checkpoint"]
    assert model_meta["run_id"] == parent.info.run_id


def test_summary_best_is_the_best_child_run(asha):
    tmp, summary, _ = asha
    kids = children(summary)
    best_child = min(kids, key=lambda k: k.data.metrics["best_val_loss"])
    best = summary["best"]
    assert best["mlflow_run_id"] == best_child.info.run_id
    assert best["metric"] == pytest.approx(best_child.data.metrics["best_val_loss"], rel=1e-12)
    history = mlflow_client(summary).get_metric_history(best_child.info.run_id, "val_loss")  # logged by rank 0
    assert best["metric"] == pytest.approx(min(m.value for m in history), rel=1e-9)
    assert best["config"] == next(t["config"] for t in summary["trials"] if t["mlflow_run_id"] == best["mlflow_run_id"])
    meta = json.loads((Path(best["checkpoint"]) / "meta.json").read_text())
    assert meta["metrics"]["val_loss"] == pytest.approx(best["metric"], rel=1e-12)
    assert best["registered_model"] == "models:/sweep-test-model/1"
    from elastic_train.config import load

    local = mlflow_client(summary).download_artifacts(summary["mlflow_parent_run_id"], "best_config.yaml", str(tmp))
    assert load(local).train.lr == best["config"]["train.lr"]


@pytest.mark.versions
def test_stopped_trials_leave_no_workers_or_placement_groups(asha, ray_module):
    """ray#54305: ASHA-stopped trials' Train placement groups outlive them; the sweep's reaper removes them."""
    from elastic_train.sweep.placement_groups import actor_created_placement_groups, stranded_cleaners

    tmp, summary, _ = asha
    ray = ray_module
    assert actor_created_placement_groups() == [] and stranded_cleaners() == []
    wait_for(lambda: ray.available_resources().get("CPU") == ray.cluster_resources().get("CPU"), 30,
             "every CPU to be free again after the sweep")
    from ray._private.state import actors

    alive = [a for a in actors().values() if a["State"] == "ALIVE"]
    assert not [a for a in alive if a.get("ActorClassName") in ("RayTrainWorker", "TrainController")]
    # Fewer helper processes per trial (launch/controller.py): the sweep reaps its trials' placement groups, so no
    # trial starts Ray's PlacementGroupCleaner, and no run with no Ray datasets starts a DatasetManager; each
    # was a new Python process per trial. Ray Train's other helpers are still there (the check can see them).
    begin, end = json.loads((tmp / "window.json").read_text())  # the session's cluster holds other tests' actors
    started = {a.get("ActorClassName") for a in actors().values()
               if begin * 1000 <= (a["StartTime"] or 0) <= end * 1000}
    assert "SynchronizationActor" in started and "TrainController" in started, started
    from elastic_train.compat import features

    if features.enabled("lean_callbacks"):
        assert not started & {"PlacementGroupCleaner", "DatasetManager"}, started
    else:  # Ray Train's own helpers (the public path); the reaper ended every cleaner whose controller is gone
        assert "PlacementGroupCleaner" in started, started


def test_more_concurrent_trials_than_the_cluster_holds_exits_2(ray_session, home, capsys):
    args = sweep_args(home, "too-many", "sweep.max_concurrent_trials=5")
    assert sweep_job.main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "sweep.max_concurrent_trials=5: the cluster holds at most 1 trial" in err[0]
    assert not (home / "too-many" / "tuner.pkl").exists()


def test_a_failing_trial_does_not_stop_the_sweep(ray_session, home):
    """One trial's workers cannot start (an unwritable trace path): it fails after its own budget (none: a retry
    would meet the same path); the other runs."""
    summary = run_sweep(home, "one-fails", "sweep.scheduler=none", "train.epochs=1", "failure.max_failures=0",
                        "sweep.space={data.trace_path: {type: grid, values: [null, /proc/no-such-dir/trace]}}")
    by_path = {t["config"]["data.trace_path"]: t for t in summary["trials"]}
    assert by_path[None]["status"] == "FINISHED" and by_path[None]["epochs"] == 1
    assert by_path["/proc/no-such-dir/trace"]["status"] == "FAILED" and by_path["/proc/no-such-dir/trace"]["error"]
    assert summary["best"]["config"] == {"data.trace_path": None}
    assert {k.data.tags["elastic_train.run_name"]: k.info.status for k in children(summary)} == {
        t["run_name"]: "FINISHED" if t["status"] == "FINISHED" else "FAILED" for t in summary["trials"]}


def trial_states(sweep_dir: Path) -> dict[str, str]:
    """Trial id -> status in Tune's latest saved experiment state."""
    files = sorted(sweep_dir.glob("experiment_state-*.json"))
    if not files:
        return {}
    try:
        data = json.loads(files[-1].read_text())
    except json.JSONDecodeError:  # caught mid-write
        return {}
    return {t["trial_id"]: t["status"] for t in (json.loads(raw) for raw, _ in data["trial_data"])}


def kill_sweep_when(ray_session, home: Path, name: str, overrides: list[str], ready, what: str):
    """Run ``jobs.sweep`` as a subprocess (each step stretched by 0.3 s, Tune's state saved every second), SIGKILL
    its whole process group once ``ready()`` returns a value (bounded: 300 s), and return that value."""
    env = dict(os.environ, RAY_ADDRESS=ray_session.get_runtime_context().gcs_address,
               ELASTIC_TRAIN_FAULT="delay=0.3",  # stretch each trial: time to kill one mid-run
               TUNE_GLOBAL_CHECKPOINT_S="1")      # save Tune's experiment state every second
    proc = subprocess.Popen([sys.executable, "-m", "jobs.sweep", *sweep_args(home, name, *overrides)], cwd=ROOT,
                            env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return wait_for(ready, 300, what)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# ~60-80 s: two sweeps' start-ups (the killed driver's and the resumed one's) and two trials, one of them
# stretched (0.3 s a step) so that the kill lands while it trains, after the other finished
def test_a_killed_sweep_resumes_without_rerunning_finished_trials(ray_session, home):
    """SIGKILL the sweep's driver while trial 2 trains (trial 1 done), then ``--resume NAME``."""
    from elastic_train.launch.storage import SNAPSHOT_FILE, RunStorage

    name = "resumed"
    overrides = ["sweep.search=grid", "sweep.scheduler=none", "checkpoint.every_steps=4",
                 "sweep.space={train.lr: {type: grid, values: [0.01, 0.001]}}"]
    sweep_dir = home / name

    def one_done_one_midway():
        states = trial_states(sweep_dir)
        done = [t for t, s in states.items() if s == "TERMINATED"]
        running = [t for t, s in states.items() if s == "RUNNING"
                   and (sweep_dir / f"trial-{t}" / SNAPSHOT_FILE).exists()]
        return (done, running) if done and running else None

    done, running = kill_sweep_when(ray_session, home, name, overrides, one_done_one_midway,
                                    "one trial finished and another one checkpointed")
    results_before = {t: (sweep_dir / f"tune-{t}" / "result.json").read_text() for t in done}
    mid = RunStorage(str(sweep_dir), f"trial-{running[0]}")
    assert mid.checkpoints() and (
        json.loads(mid.read_text(f"{mid.checkpoints()[-1]}/meta.json"))["progress"]["epoch"] < 2
    )

    assert sweep_job.main(["--resume", name, f"checkpoint.storage_path={home}", "--summary-json",
                           str(home / "resumed.json")]) == 0
    summary = json.loads((home / "resumed.json").read_text())
    assert len(summary["trials"]) == 2 and {t["status"] for t in summary["trials"]} == {"FINISHED"}
    for t in done:  # not rerun: Tune's record of the finished trial did not grow
        assert (sweep_dir / f"tune-{t}" / "result.json").read_text() == results_before[t]
    kids = children(summary)
    assert len(kids) == 2 and len(runs_named(summary, name)) == 1  # found again, not duplicated
    midway = next(k for k in kids if k.data.tags["elastic_train.run_name"] == f"trial-{running[0]}")
    assert midway.data.metrics["restarts"] >= 1  # resumed from its checkpoint, in the same child run


def test_a_placement_group_outlives_its_killed_creator_until_the_reaper_removes_it(ray_session):
    """The root of ray#54305, without Tune: an actor-created placement group survives its creator's death while
    the job lives. If Ray ever removes it by itself, the first assertion says the workaround can go."""
    from ray.util.placement_group import placement_group_table

    from elastic_train.sweep.placement_groups import (
        orphaned_placement_groups,
        remove_orphaned_placement_groups,
    )

    ray = ray_session

    @ray.remote(num_cpus=0)
    class Creator:
        def make(self) -> str:
            pg = ray.util.placement_group([{"CPU": 1}])
            ray.get(pg.ready(), timeout=60)
            return pg.id.hex()

    creator = Creator.remote()
    pg_id = ray.get(creator.make.remote())
    assert pg_id not in orphaned_placement_groups()  # its creator lives: not an orphan
    ray.kill(creator)
    wait_for(lambda: pg_id in orphaned_placement_groups(), 30, "the group to be an orphan")
    assert placement_group_table()[pg_id]["state"] == "CREATED", "Ray removed it itself: the reaper may go"
    assert pg_id in remove_orphaned_placement_groups()
    wait_for(lambda: placement_group_table()[pg_id]["state"] == "REMOVED", 30, "the group to be removed")


def test_pbt_clones_a_strong_trial_into_a_weak_one_at_the_donors_checkpoint(ray_session, home):
    """Two 2-worker trials (lr 1e-2 and 1e-5), 2 epochs, one synchronous PBT decision (after epoch 1; asynchronous
    PBT skips a decision when the strong trial's report comes after the weak one's; none is taken on the last
    report): the weak trial continues from the strong one's checkpoint. Both ranks' traces show the take-over and
    their first step after it: the donor's position, the donor's samples. The schedule reaches results.csv and
    MLflow. Kept small for the suite's budget: every PBT restart is a new Ray Train run (docs/sweeps.md)."""
    import csv

    from elastic_train.launch.storage import RunStorage

    trace = home / "trace"
    summary = run_sweep(home, "pbt", "sweep.search=grid", "sweep.scheduler=pbt", "sweep.perturbation_interval=1",
                        "sweep.quantile_fraction=0.5", "sweep.resample_probability=0", "train.epochs=2",
                        # 2 trials x (1 driver + 2 workers x 0.5 CPU) on the session's 4 CPUs: both at once
                        "sweep.synch=true", "scaling.num_workers=2", "scaling.resources_per_worker={CPU: 0.5}",
                        "sweep.space={train.lr: {type: grid, values: [0.01, 0.00001]}}", f"data.trace_path={trace}")
    assert summary["scheduler"] == "pbt" and {t["status"] for t in summary["trials"]} == {"FINISHED"}
    kids = {k.data.tags["elastic_train.run_name"]: k for k in children(summary)}
    clones = [name for name, k in kids.items() if "pbt.cloned_from" in k.data.tags]
    assert clones, "no exploit happened"
    clone = clones[0]
    tags = kids[clone].data.tags
    donor, at_step = tags["pbt.cloned_from"], int(tags["pbt.cloned_at_step"])
    assert donor in kids and donor != clone
    for rank in (0, 1):
        lines = [json.loads(line) for line in Path(f"{trace}.{clone}.rank{rank}").read_text().splitlines()]
        marks = [i for i, line in enumerate(lines) if "event" in line]
        assert marks, f"rank {rank}: the clone's trace has no take-over"
        origin = lines[marks[-1]]["event"]["cloned_from"]
        assert (origin["run_name"], origin["global_step"]) == (donor, at_step)
        first = lines[marks[-1] + 1]  # the clone's first step after the take-over: the donor's next one
        assert (first["epoch"], first["step"], first["world_size"]) == (origin["epoch"], origin["step_in_epoch"], 2)
        donors = [json.loads(line) for line in Path(f"{trace}.{donor}.rank{rank}").read_text().splitlines()]
        same = [d["ids"] for d in donors if (d.get("epoch"), d.get("step")) == (first["epoch"], first["step"])]
        assert same and same[-1] == first["ids"]  # the same samples as the donor's own step there
    # The donor had a checkpoint at exactly that step (Tune's copy in its trial folder) ...
    donor_id = donor.removeprefix("trial-")
    steps = [json.loads(p.read_text())["progress"]["global_step"]
             for p in (home / "pbt" / f"tune-{donor_id}").glob("checkpoint_*/meta.json")]
    assert at_step in steps
    # ... and the clone went on from it to the end, with its own (perturbed) learning rate.
    run = RunStorage(summary["storage_path"], clone)
    meta = json.loads(run.read_text(f"{run.checkpoints()[-1]}/meta.json"))
    assert meta["run_name"] == clone and meta["progress"]["epoch"] == 2 and meta["progress"]["global_step"] > at_step
    assert "hp.train.lr" in kids[clone].data.metrics
    # Its weights' schedule: the donor's stretch from step 0, then its own from the take-over on, everywhere.
    lr = meta["config"]["train"]["lr"]
    assert [(e["step"], e["run_name"], e.get("cloned_from")) for e in meta["schedule"]] == [
        (0, donor, None), (at_step, clone, donor)]
    assert meta["schedule"][-1]["lr"] == lr and meta["schedule"][0]["lr"] == 0.01
    assert json.loads(tags["hp_schedule"]) == meta["schedule"]
    local = mlflow_client(summary).download_artifacts(summary["mlflow_parent_run_id"], "results.csv", str(home))
    row = next(r for r in csv.DictReader(Path(local).open()) if f"trial-{r['trial_id']}" == clone)
    expected = f"0:0.01 {at_step}:{lr:.4g}" if lr != 0.01 else "0:0.01"
    assert (row["lr_schedule"], row["cloned_from"]) == (expected, f"{donor}@{at_step}")


@pytest.mark.timeout(1500)  # ~7 min at load 30 on 2 cores: the strong trial must outlive the weak one's start and stop
@pytest.mark.long  # ~2 min; its timing (the weak trial held back until the strong one checkpoints) once let the
# weak trial start while the strong one was between worker groups (it got 2 workers); tests/cluster covers growth.
# Run after this file's other sweeps it used to fail: their killed Train controllers (PBT pauses, a failing trial,
# a killed sweep) left resource requests the coordinator keeps 180 s. Each fit and the sweep's driver now cancel
# those (launch/reservations.py): the whole file but the PBT resume, `-m ""`, passed (2026-12-06, 4 min 26 s).
@pytest.mark.soak
def test_an_elastic_trial_grows_into_the_workers_of_a_stopped_trial(ray_session, home, monkeypatch):
    """Elastic trials ``[1, 2]`` on the session's 4 CPUs: two trials at once, each at its floor (1 driver CPU + 1
    worker); no room for a second worker while both live. The weak trial (shuffled labels) is held back until the
    strong one has checkpointed its first epoch, so it reaches ASHA's first rung second and is stopped there;
    the strong one then grows to 2 workers and ends with the train loss of the same trial run alone on 2 workers
    (the global batch is kept: its result does not depend on when it grew)."""
    from jobs import train

    name = "elastic"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", "delay=0.25")  # stretch the strong trial: it outlives the weak one
    gate = str(home / name / "trial-*" / "checkpoint_*" / "meta.json")
    common = ["data.name=tests.helpers.user_code:gated_digits", "train.epochs=12", "scaling.resize_check_interval_s=1"]
    summary = run_sweep(home, name, *common, "sweep.search=grid", "sweep.scheduler=asha", "sweep.grace_period=1",
                        "sweep.reduction_factor=2", "scaling.num_workers=[1, 2]",
                        f"sweep.space={{data.options: {{type: grid, values: [{{}}, {{after: '{gate}', "
                        "shuffle_labels: true}]}}")
    assert summary["max_concurrent_trials"] == 2
    by_kind = {bool(t["config"]["data.options"]): t for t in summary["trials"]}
    strong, weak = by_kind[False], by_kind[True]
    assert (weak["status"], weak["epochs"], weak["world_sizes"]) == ("STOPPED", 1, [1])
    assert strong["status"] == "FINISHED" and strong["epochs"] == 12
    assert strong["world_sizes"] == [1, 2] and strong["restarts"] >= 1, strong  # started at its floor, grew
    from elastic_train.launch.storage import RunStorage

    run = RunStorage(summary["storage_path"], strong["run_name"])
    grown = json.loads(run.read_text(f"{run.checkpoints()[-1]}/meta.json"))["metrics"]

    monkeypatch.delenv("ELASTIC_TRAIN_FAULT")
    alone_json = home / "alone.json"
    assert train.main([*sweep_args(home, "alone", *common, "scaling.num_workers=2"),
                       "--summary-json", str(alone_json)]) == 0
    alone = json.loads(alone_json.read_text())
    assert alone["world_sizes"] == [2]
    assert grown["train_loss"] == pytest.approx(alone["final_metrics"]["train_loss"], rel=1e-4)


@pytest.mark.soak
@pytest.mark.long  # every PBT restart is a new Train run: 10 min at load 30-40 on 2 cores
@pytest.mark.timeout(1500)
def test_a_killed_pbt_sweep_resumes_and_finishes_every_trial(ray_session, home):
    """SIGKILL a PBT sweep's driver once both trials have checkpointed an epoch, then ``--resume NAME``: Tune's
    PBT state and every trial come back; each trial ends at the budget, in its one MLflow child run."""
    from elastic_train.launch.storage import RunStorage

    name = "pbt-resumed"
    overrides = ["sweep.search=grid", "sweep.scheduler=pbt", "sweep.perturbation_interval=1", "sweep.synch=true",
                 "sweep.quantile_fraction=0.5", "sweep.resample_probability=0",
                 "scaling.num_workers=2", "scaling.resources_per_worker={CPU: 0.5}",
                 "sweep.space={train.lr: {type: grid, values: [0.01, 0.00001]}}"]
    sweep_dir = home / name

    def both_checkpointed_none_done():
        states = trial_states(sweep_dir)
        if len(states) != 2 or "TERMINATED" in states.values():
            return None
        runs = [RunStorage(str(sweep_dir), f"trial-{t}") for t in states]
        return states if all(r.checkpoints() for r in runs) else None

    kill_sweep_when(ray_session, home, name, overrides, both_checkpointed_none_done,
                    "both PBT trials checkpointed, none finished")
    assert sweep_job.main(["--resume", name, f"checkpoint.storage_path={home}", "--summary-json",
                           str(home / f"{name}.json")]) == 0
    summary = json.loads((home / f"{name}.json").read_text())
    assert summary["scheduler"] == "pbt" and len(summary["trials"]) == 2
    assert {t["status"] for t in summary["trials"]} == {"FINISHED"} and {t["epochs"] for t in summary["trials"]} == {2}
    for t in summary["trials"]:
        run = RunStorage(summary["storage_path"], t["run_name"])
        meta = json.loads(run.read_text(f"{run.checkpoints()[-1]}/meta.json"))
        assert meta["run_name"] == t["run_name"] and meta["progress"]["epoch"] == 2
    kids = children(summary)
    assert len(kids) == 2 and len(runs_named(summary, name)) == 1  # found again, not duplicated
    assert {k.info.status for k in kids} == {"FINISHED"}


def test_a_trial_on_a_reused_process_and_warm_spares_ends_bitwise_as_the_same_trial_on_new_ones(
        ray_session, home, monkeypatch):
    """Issue 33 item 2, one ASHA sweep of three trials, one at a time: the first (lr 0.01) runs on new processes;
    ASHA stops the second (lr 1e-5, barely learns) at its first rung; the third repeats the first's config. Tune hands
    the stopped trial's process to the third (sweep/tuner.py, reuses_trial_processes), once the stopped trial's
    Train run has ended (sweep/stops.py; each step stretched by 1 s, so a stopped trial left to run would finish
    its second epoch, and Tune would wait for it or fail the third trial); the third trial's Train worker is a
    spare started while the stopped trial trained (spares from each trial's first step: sweep/plan.py). The third
    trial ends bitwise equal to the first."""
    from elastic_train.launch.storage import RunStorage

    markers = home / "reuse-markers"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"delay=1.0;markers={markers}")
    summary = run_sweep(home, "reuse", "scaling.num_workers=1", "train.global_batch_size=256", "sweep.search=grid",
                        "sweep.scheduler=asha", "sweep.grace_period=1", "sweep.reduction_factor=2",
                        "sweep.max_concurrent_trials=1",
                        "sweep.space={train.lr: {type: grid, values: [0.01, 0.00001, 0.01]}}")
    first, stopped, third = sorted(summary["trials"], key=lambda t: t["trial_id"])
    assert (stopped["config"]["train.lr"], stopped["status"], stopped["epochs"]) == (0.00001, "STOPPED", 1), stopped
    assert first["status"] == third["status"] == "FINISHED", (first, third)

    def last_meta(t: dict) -> dict:
        run = RunStorage(summary["storage_path"], t["run_name"])
        return json.loads(run.read_text(f"{run.checkpoints()[-1]}/meta.json"))

    def tune_pid(t: dict) -> int:
        return json.loads((Path(summary["storage_path"]) / f"tune-{t['trial_id']}" / "result.json")
                          .read_text().splitlines()[-1])["pid"]
    assert last_meta(stopped)["progress"]["epoch"] < 2  # its Train run ended when ASHA stopped it
    assert tune_pid(third) == tune_pid(stopped)  # the stopped trial's process ran the third
    contexts = sorted((json.loads(line) for line in (markers / "phases.rank0.jsonl").read_text().splitlines()
                       if json.loads(line)["event"] == "context"), key=lambda r: r["unix"])
    assert len(contexts) == 3, contexts
    run = RunStorage(summary["storage_path"], stopped["run_name"])
    stopped_saved = (Path(summary["storage_path"]) / stopped["run_name"] / run.checkpoints()[-1] / "meta.json")
    assert contexts[2]["process_start"] < stopped_saved.stat().st_mtime, contexts  # a spare warmed meanwhile
    assert last_meta(third)["metrics"]["params_sha256"] == last_meta(first)["metrics"]["params_sha256"]
