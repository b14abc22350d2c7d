"""A healthy run is quiet: the console shows the project's own lines, not Ray's or MLflow's chatter."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.distributed, pytest.mark.subprocess]

NOISE = re.compile(r" E |ERROR|Traceback|WARNING")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Ray 2.60's Train PlacementGroupCleaner asks the state API for "the" local cluster without an address: with a
# second Ray on the machine (another test session, a `ray start` head) it fails with this, whatever the job.
OTHER_RAY_ON_THIS_MACHINE = "Found multiple active Ray instances"


@pytest.mark.versions  # the demo, as a user runs it: on the oldest versions, and with every internal off
def test_a_healthy_run_prints_only_our_lines(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MLFLOW_")) and k != "ELASTIC_TRAIN_HOME"}
    # Its own Ray (never one on this machine), Ray's default log settings, none of the test session's.
    env.update(RAY_ADDRESS="local", ELASTIC_TRAIN_HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "jobs.train", "--config", "configs/digits.yaml", "train.epochs=1",
            "scaling.num_workers=2", "name=quiet", f"checkpoint.storage_path={tmp_path / 'ckpt'}"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=480)
    out = ANSI.sub("", proc.stdout)
    assert proc.returncode == 0, out
    lines = out.splitlines()
    cleaner = [line for line in lines if line.startswith("(PlacementGroupCleaner pid=")]
    if any(OTHER_RAY_ON_THIS_MACHINE in line for line in cleaner):
        lines = [line for line in lines if line not in cleaner]
    noisy = [line for line in lines if NOISE.search(line)]
    assert not noisy, "\n".join(noisy)
    assert not [line for line in lines if "mlflow" in line and " INFO " in line], out
    assert "params sha256" in out and "[elastic-train] epoch 1/1" in out, out
