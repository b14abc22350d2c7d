"""The tracking seam: the same real run with ``tracking.backend=jsonl`` instead of MLflow, nothing else changed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed


def test_jsonl_backend_is_one_config_value(job):
    summary = job("jsonl-seam", "tracking.backend=jsonl", "scaling.num_workers=1", "train.epochs=1")
    assert summary["status"] == "FINISHED"
    root = Path(os.environ["ELASTIC_TRAIN_HOME"]) / "tracking"
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
