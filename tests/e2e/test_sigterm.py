"""SIGTERM to a training driver (``kill``, ``ray job stop``, a scheduler's pre-emption) ends the run as Ctrl-C does:
status KILLED, exit 130, the summary naming the checkpoint the same command resumes from. Before, ``ray.init``'s
abseil failure handler (ray#64830) printed a C++ stack and aborted the driver 3 s into its orderly end: exit 134."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import ROOT

pytestmark = pytest.mark.e2e


def test_sigterm_ends_a_training_run_killed_with_exit_130_and_no_abort(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    env.update(ELASTIC_TRAIN_HOME=str(tmp_path), RAY_ADDRESS="local", PYTHONPATH=str(ROOT))
    summary_json = tmp_path / "summary.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobs.train", "--config", "configs/digits.yaml", "train.epochs=1000",
         f"checkpoint.storage_path={tmp_path / 'results'}", "--summary-json", str(summary_json)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list((tmp_path / "results").glob("*/checkpoint_*/meta.json")):  # training, one epoch saved
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out[-3000:]
    assert "SIGTERM received" not in out and "logging.cc" not in out, out[-3000:]
    summary = json.loads(summary_json.read_text())
    assert summary["status"] == "KILLED" and "interrupted" in summary["error"]
    assert summary["checkpoint"] and summary["steps"] > 0  # where the same command resumes
