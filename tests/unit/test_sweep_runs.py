"""The sweep's driver opens and closes each trial's tracking run (sweep/runs.py): the trial only reads a handoff
file naming the run and writes its summary. Exercised with the JSON-lines backend (a real store on disk)."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from elastic_train.launch import context
from elastic_train.sweep import runs
from elastic_train.sweep.plan import trial_run_name
from tracking import open_backend

SECRET = "s3cret-do-not-store"


def sweep_context(tmp_path: Path):
    ctx = context.plan(None, ["name=sw", f"checkpoint.storage_path={tmp_path / 'results'}", "tracking.backend=jsonl",
                              f"tracking.uri={tmp_path / 'tracking'}", "tracking.experiment=sweeps"])
    parent = context.open_run(ctx, open_backend("jsonl", str(tmp_path / "tracking"), tmp_path), kind="sweep",
                              env_params={})
    return replace(ctx, tracking=replace(parent, env={"MLFLOW_TRACKING_PASSWORD": SECRET}))


def trial(trial_id: str, **config):
    return SimpleNamespace(trial_id=trial_id, config=config, checkpoint=None)


def run_file(tmp_path: Path, run_id: str) -> dict:
    (found,) = (tmp_path / "tracking").glob(f"*/{run_id}/run.json")
    return json.loads(found.read_text())


def test_the_driver_opens_a_trial_run_and_closes_it_from_the_trials_summary(tmp_path):
    sweep = sweep_context(tmp_path)
    sweep_dir = sweep.storage.uri()
    callback = runs.TrialRuns(sweep, sweep_dir, {"name": "digits", "digest": "abc"}, "obj-1")
    callback.on_trial_start(0, [], trial("t_00000", **{"train.lr": 0.01}))

    handoff = runs.read_handoff(sweep_dir, trial_run_name("t_00000"))
    assert handoff is not None
    spec = handoff.spec(sweep.tracking)
    assert spec.env == sweep.tracking.env  # credentials from memory, never from the file
    assert SECRET not in (Path(sweep_dir) / runs.RUNS_FOLDER / "trial-t_00000.json").read_text()
    run = run_file(tmp_path, spec.run_id)
    assert run["parent_run_id"] == sweep.tracking.run_id and run["status"] == "RUNNING"
    assert run["params"]["train.lr"] == "0.01" and run["tags"]["trial_id"] == "t_00000"
    assert run["tags"]["data_object"] == "obj-1" and run["inputs"] == [{"name": "digits", "digest": "abc"}]

    summary = {"status": "FINISHED", "final_metrics": {"train_loss": 0.5, "val_loss": 0.25, "val_accuracy": 0.9},
               "steps": 11, "restarts": 0, "world_sizes": [1], "goodput": {"wall_s": 9.0, "goodput_ratio": 0.5}}
    runs.write_summary(sweep_dir, trial_run_name("t_00000"), summary)
    callback.on_trial_complete(0, [], trial("t_00000", **{"train.lr": 0.01}))
    runs.drain_all()
    run = run_file(tmp_path, spec.run_id)
    assert run["status"] == "FINISHED" and run["tags"]["world_sizes"] == "[1]"
    (folder,) = (tmp_path / "tracking").glob(f"*/{spec.run_id}")
    logged = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    by_key = {m["key"]: (m["value"], m["step"]) for m in logged}
    assert by_key["hp.train.lr"] == (0.01, 0)  # the trial's values at the step it starts from
    assert by_key["final_val_loss"] == (0.25, 11) and by_key["goodput_goodput_ratio"] == (0.5, 11)


def test_a_trial_that_builds_its_own_data_gets_no_handoff(tmp_path):
    sweep = sweep_context(tmp_path)
    callback = runs.TrialRuns(sweep, sweep.storage.uri(), None, "own")
    callback.on_trial_start(0, [], trial("t_00001", seed=7))
    assert runs.read_handoff(sweep.storage.uri(), trial_run_name("t_00001")) is None
    assert runs.rebuilds_data(sweep, {"seed": 7}) and not runs.rebuilds_data(sweep, {"train.lr": 0.1})
    runs.drain_all()


def test_the_callback_saved_with_tunes_experiment_holds_no_credentials(tmp_path):
    sweep = sweep_context(tmp_path)
    callback = runs.TrialRuns(sweep, sweep.storage.uri(), None, "own")
    blob = pickle.dumps(callback)
    assert SECRET.encode() not in blob
    restored = pickle.loads(blob)
    assert restored in runs._LIVE and restored.sweep.tracking.run_id == sweep.tracking.run_id
    runs.drain_all()
    assert runs._LIVE == []
