"""Two settings seen in one real 2-worker gloo run (one run for both: each costs ~10 s on 2 cores):

* The tracking seam: ``tracking.backend=jsonl`` instead of MLflow, nothing else changed.
* Sync cadence is a setting of its own (``train.sync_every_steps``), not a side effect of logging: with train
  metrics logged only at the epoch's end, a clock-based checkpoint still comes at the next sync point.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.helpers.worker_logs import WorkerLogs

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def run(ray_module, session_home, tmp_path_factory):
    from tests.distributed.conftest import run_job

    os.environ["ELASTIC_TRAIN_HOME"] = str(session_home)
    logs = WorkerLogs(ray_module)
    summary = run_job(tmp_path_factory.mktemp("results"), "jsonl-seam", "tracking.backend=jsonl", "train.epochs=1",
                      "tracking.log_every_steps=1000", "train.sync_every_steps=3", "checkpoint.every_seconds=0.001")
    return summary, logs.since(), session_home


def test_jsonl_backend_is_one_config_value(run):
    summary, _, home = run
    assert summary["status"] == "FINISHED"
    root = Path(home) / "tracking"
    assert summary["tracking_uri"] == str(root)
    runs = [json.loads(p.read_text()) for p in root.glob("*/*/run.json")]
    mine = [r for r in runs if r["name"] == "jsonl-seam"]
    assert len(mine) == 1  # one run per logical run, as with MLflow
    run = mine[0]
    assert run["run_id"] == summary["mlflow_run_id"] and run["status"] == "FINISHED"
    assert run["params"]["train.global_batch_size"] == "128" and "env.torch" in run["params"]
    run_dir = next(p.parent for p in root.glob("*/*/run.json") if json.loads(p.read_text())["name"] == "jsonl-seam")
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_steps = [m["step"] for m in lines if m["key"] == "train_loss"]
    assert train_steps and train_steps == sorted(set(train_steps))  # rank 0 logged each step once
    finals = {m["key"]: m["value"] for m in lines if m["key"].startswith("final_")}
    assert finals["final_val_loss"] == pytest.approx(summary["final_metrics"]["val_loss"])
    assert (run_dir / "model").is_dir() and summary.get("model_uri")


def test_clock_checkpoints_come_at_sync_points_when_logging_is_rare(run):
    summary, worker_lines, _ = run
    assert summary["status"] == "FINISHED" and summary["world_sizes"] == [2]
    steps = [int(s) for s in re.findall(r"epoch [\d.]+/1 step (\d+): .*\[checkpoint: every 0\.001 s\]", worker_lines)]
    # Before this setting the only sync point of such a run was its epoch end: no clock checkpoint at all.
    assert steps and all(s % 3 == 0 for s in steps), steps
