"""Every metric a sweep's trials report to Tune reaches their MLflow child runs, exactly once, under load
(issue 51 item 6).

A 12-trial ASHA sweep of the digits preset (3 epochs: ASHA's rungs at epochs 1 and 2, every trial 2 DDP
workers) runs while two processes spin a CPU each on this 2-core machine, once on the sqlite store and once on
a real ``mlflow server``. Tune's own record of each trial (``<storage>/<sweep>/tune-<trial id>/result.json``:
one line per report that rank 0 of the trial's Ray Train workers made, passed on by Ray's
``TuneReportCallback``) is then compared with the trial's child run.

What a report holds and where MLflow has it (``train/session.py``: ``Session.checkpoint`` reports at epoch
ends; ``_validate_and_log`` and ``_sync_and_log`` log, through the sweep's relay, ``tracking/relay.py``;
``sweep/runs.py`` and ``launch/summary.py`` ``close_run``: the driver's final metrics; ``sweep/results.py``
``close_children``: the sweep's outcome per child):

========================================  =========================================================================
reported key (report at step ``s``)       in the child run
========================================  =========================================================================
``val_loss``, ``val_accuracy``            the same key at step ``s``, the same value
``epoch`` (completed epochs)              ``epoch`` at step ``s`` (logged fractional at every log point; whole at
                                          an epoch end), the same value
``train_loss``, ``train_accuracy``        the epoch's mean; MLflow holds the mean of each log window
(the epoch's)                             (``tracking.log_every_steps`` and the epoch end): the windows logged at
                                          steps ``s - steps_per_epoch < step <= s``, weighted by their steps, give
                                          the reported value (every window of the epoch is there)
``world_size``, ``restarts``              logged when a worker group starts (its first step): the latest entry at
                                          a step ``<= s`` has the reported value
``global_step``                           the step axis of all the above
final report of a FINISHED trial:         ``final_train_loss``, ``final_val_loss``, ``final_val_accuracy`` at the
``train_loss``, ``val_loss``,             final step (the driver's ``close_run``), the same values; ``world_sizes``
``val_accuracy``, ``world_sizes``         as a tag
``config`` (Tune's: the trial's values)   ``hp.<key>`` at step 0 (the driver's ``TrialRuns``)
========================================  =========================================================================

Not in MLflow as reported: Tune's bookkeeping (``training_iteration``, ``time_this_iter_s``, ``time_total_s``,
``time_since_restore``, ``iterations_since_restore``, ``timestamp``, ``date``, ``done``, ``trial_id``, ``pid``,
``hostname``, ``node_ip``, ``checkpoint_dir_name``, and ``checkpoint_path``, which ``TuneReportCallback`` adds);
``samples_seen`` and ``reason`` (checkpoint metadata, in ``meta.json``); the final report's run summary
(``params_sha256``, ``samples_per_second[_median]``, ``data_wait_share``, ``tokens_per_second``, ``mfu``,
``first_step_unix``, ``steps_per_epoch``, ``tracking_unsent``, ``tracking_spool``, ``checkpoint_interval``,
``goodput``: the summary JSON's; MLflow's ``samples_per_second`` and ``data_wait_share`` are per log window,
and its ``goodput_*`` are the book at each checkpoint and, from the driver, the wall's parts).

Every metric of every child run has one entry per step (a duplicate would be a metric sent twice), and each
child run's status is its trial's: FINISHED; STOPPED (by ASHA) is FINISHED with ``stopped_early=true``, as Ray's
MLflow callback marks it; FAILED is FAILED.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import sweep as sweep_job
from tests.helpers.mlflow_server import MlflowServer

# two 12-trial sweeps beside two busy loops: several minutes each on 2 cores (make test-long)
pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.long, pytest.mark.soak]

PRESET = "configs/sweep-digits.yaml"
EPOCHS = 3  # ASHA's max_t: rungs at epochs 1 and 2 (grace 1, reduction 2)
TRIALS = 12
BUSY_LOOPS = 2
# Tune's bookkeeping in every result (ray.tune.result's auto-filled keys) and TuneReportCallback's checkpoint path
TUNE_KEYS = {"training_iteration", "time_this_iter_s", "time_total_s", "time_since_restore", "timestamp", "date",
             "iterations_since_restore", "timesteps_since_restore", "timesteps_total", "episodes_total", "done",
             "trial_id", "pid", "hostname", "node_ip", "config", "checkpoint_dir_name", "checkpoint_path",
             "experiment_tag", "should_checkpoint"}
SAME_KEY = ("val_loss", "val_accuracy", "epoch")  # the same key, at the report's step, the same value
EPOCH_MEANS = ("train_loss", "train_accuracy")  # the step-weighted mean of the epoch's log windows
AT_WORKER_START = ("world_size", "restarts")  # the latest entry at or before the report's step
CHECKPOINT_META = {"global_step", "samples_seen", "reason"}
FINAL_SUMMARY = {"params_sha256", "samples_per_second", "samples_per_second_median", "data_wait_share",
                 "tokens_per_second", "mfu", "peak_memory_bytes", "first_step_unix", "steps_per_epoch",
                 "tracking_unsent", "tracking_spool", "checkpoint_interval", "goodput", "world_sizes"}
FINAL_METRICS = ("train_loss", "val_loss", "val_accuracy")  # -> final_<key> at the final step


@pytest.fixture
def busy_loops() -> Iterator[list[subprocess.Popen]]:
    """Two processes spinning a CPU each beside the sweep (the load a shared machine gives it)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(BUSY_LOOPS)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


@pytest.fixture(params=["sqlite", "mlflow-server"])
def tracking_uri(request, home: Path, tmp_path: Path) -> Iterator[str | None]:
    """None: the session's sqlite store (the default under ``$ELASTIC_TRAIN_HOME``); else a real server's URI."""
    if request.param == "sqlite":
        yield None
        return
    server = MlflowServer(tmp_path / "mlflow-server").start(timeout_s=120)
    try:
        yield server.uri
    finally:
        server.stop()


def test_every_reported_metric_of_every_trial_reaches_mlflow_once_under_load(ray_session, home, tracking_uri,
                                                                              busy_loops):
    name = "metrics"
    overrides = [f"name={name}", f"checkpoint.storage_path={home}", f"train.epochs={EPOCHS}",
                 "tracking.system_metrics=false", f"sweep.num_samples={TRIALS}", "sweep.scheduler=asha",
                 "sweep.grace_period=1", "sweep.reduction_factor=2", "scaling.num_workers=2",
                 # two trials at once on the session's 4 logical CPUs: 2 x (0.5 driver + 2 workers x 0.5)
                 *([f"tracking.uri={tracking_uri}"] if tracking_uri else [])]
    summary_path = home / f"{name}.json"
    started = time.monotonic()
    assert all(p.poll() is None for p in busy_loops)
    assert sweep_job.main(["--config", PRESET, *overrides, "--summary-json", str(summary_path)]) == 0
    wall = time.monotonic() - started
    assert all(p.poll() is None for p in busy_loops), "a busy loop ended before the sweep did"
    summary = json.loads(summary_path.read_text())
    trials = summary["trials"]
    assert len(trials) == TRIALS and {t["status"] for t in trials} <= {"FINISHED", "STOPPED", "FAILED"}, trials
    assert "STOPPED" in {t["status"] for t in trials}, "ASHA stopped no trial: the stopped path went unchecked"

    client = _client(summary["tracking_uri"])
    kids = _children(client, summary)
    assert sorted(kids) == sorted(t["run_name"] for t in trials)
    problems: list[str] = []
    checked = Counter()
    for t in trials:
        run = kids[t["run_name"]]
        reports = tune_reports(Path(summary["storage_path"]) / f"tune-{t['trial_id']}" / "result.json")
        history = {key: client.get_metric_history(run.info.run_id, key) for key in run.data.metrics}
        found = [f"{t['run_name']} ({t['status']}): {p}" for p in check_trial(t, reports, history, run, checked)]
        problems += found
    print(f"sweep of {TRIALS} trials beside {BUSY_LOOPS} busy loops, store {summary['tracking_uri'].split(':')[0]}:"
          f" {wall:.0f} s; checked {dict(checked)}")
    assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)
    assert checked["reports"] >= TRIALS and checked["final"] >= 1  # something was compared, every kind of it


def tune_reports(path: Path) -> list[dict]:
    """Tune's record of one trial's reports, one per ``training_iteration`` (a finished function trainable's
    last result may be written twice)."""
    by_iteration: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            result = json.loads(line)
            by_iteration[result["training_iteration"]] = result
    return [by_iteration[i] for i in sorted(by_iteration)]


def check_trial(trial: dict, reports: list[dict], history: dict[str, list], run, checked: Counter) -> list[str]:
    """What is wrong with one trial's child run against its Tune reports (empty: nothing)."""
    problems = []
    for key, entries in history.items():  # exactly once: a metric sent twice has two entries at one step
        steps = Counter(m.step for m in entries)
        twice = sorted(s for s, n in steps.items() if n > 1)
        if twice:
            problems.append(f"{key}: {len(twice)} step(s) logged more than once, e.g. step {twice[0]}: "
                            f"{[m.value for m in entries if m.step == twice[0]]}")
    at = {key: {m.step: m.value for m in entries} for key, entries in history.items()}
    if not reports:
        return [*problems, "Tune recorded no report"]
    unknown = set(reports[-1]) - TUNE_KEYS - CHECKPOINT_META - FINAL_SUMMARY - set(SAME_KEY) - set(EPOCH_MEANS) \
        - set(AT_WORKER_START)
    if unknown:
        problems.append(f"reported keys this test does not map: {sorted(unknown)} (the module docstring's table)")
    previous_step = 0
    for r in reports:
        step = r["global_step"]
        for key in SAME_KEY:
            if at.get(key, {}).get(step) != r[key]:
                problems.append(f"{key} at step {step}: reported {r[key]!r}, MLflow {at.get(key, {}).get(step)!r}")
        for key in EPOCH_MEANS:
            windows = sorted((s, v) for s, v in at.get(key, {}).items() if previous_step < s <= step)
            mean = _weighted(windows, previous_step)
            if mean is None or mean != pytest.approx(r[key], rel=1e-9, abs=1e-12):
                problems.append(f"{key} of the epoch ending at step {step}: reported {r[key]!r}, its MLflow "
                                f"windows {windows} give {mean!r}")
        for key in AT_WORKER_START:
            earlier = [s for s in at.get(key, {}) if s <= step]
            if not earlier or at[key][max(earlier)] != r[key]:
                problems.append(f"{key} at step {step}: reported {r[key]!r}, MLflow's latest at or before it "
                                f"{at[key][max(earlier)] if earlier else None!r}")
        previous_step = step
        checked["reports"] += 1
    problems += check_outcome(trial, reports, at, run, checked)
    return problems


def check_outcome(trial: dict, reports: list[dict], at: dict[str, dict], run, checked: Counter) -> list[str]:
    """The run's status, its trial's hyperparameters, and a finished trial's final metrics."""
    problems = []
    status, last = trial["status"], reports[-1]
    expected_status = "FAILED" if status == "FAILED" else "FINISHED"
    if run.info.status != expected_status or run.data.tags.get("stopped_early") != str(status == "STOPPED").lower():
        problems.append(f"run status {run.info.status}, stopped_early={run.data.tags.get('stopped_early')!r}")
    if status == "STOPPED" and last["epoch"] >= EPOCHS:
        problems.append(f"STOPPED, but Tune saw it reach epoch {last['epoch']}")
    for key, value in last["config"].items():
        if isinstance(value, int | float) and at.get(f"hp.{key}", {}).get(0) != float(value):
            problems.append(f"hp.{key} at step 0: Tune's config {value!r}, MLflow {at.get(f'hp.{key}')!r}")
    if status == "FINISHED":
        if last["epoch"] != EPOCHS:
            problems.append(f"FINISHED at epoch {last['epoch']} of {EPOCHS}")
        for key in FINAL_METRICS:
            logged = at.get(f"final_{key}", {}).get(last["global_step"])
            if logged != last[key]:
                problems.append(f"final_{key} at step {last['global_step']}: reported {last[key]!r}, MLflow {logged!r}")
        if run.data.tags.get("world_sizes") != str(last["world_sizes"]):
            problems.append(f"world_sizes tag {run.data.tags.get('world_sizes')!r}, reported {last['world_sizes']}")
        checked["final"] += 1
    return problems


def _weighted(windows: list[tuple[int, float]], start: int) -> float | None:
    """The mean over an epoch's steps of its log windows' means (each window: the steps since the one before)."""
    if not windows:
        return None
    total, before = 0.0, start
    for step, value in windows:
        total += value * (step - before)
        before = step
    return total / (before - start)


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _children(client, summary: dict) -> dict[str, object]:
    parent = client.get_run(summary["mlflow_parent_run_id"])
    kids = client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    return {k.data.tags["elastic_train.run_name"]: k for k in kids}
