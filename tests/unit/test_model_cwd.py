"""Logging the final model writes nothing in the current folder (issue 34 item 12): MLflow 3 filed the
LoggedModel under the default experiment "0", whose artifact root is ./mlruns of the cwd. Real MLflow on a
sqlite store under the run's home, the driver's own call (tracking.models.log_final_model); 17-39 s here under load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tracking import open_backend
from tracking.models import log_final_model

pytestmark = pytest.mark.slow


def test_the_final_model_is_logged_under_the_home_not_the_cwd(tmp_path, monkeypatch):
    cwd, home = tmp_path / "empty", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    monkeypatch.chdir(cwd)
    backend = open_backend("mlflow", None, home)
    spec, _ = backend.start_run("cwd", "r", kind="train", spool_path=home / "spool.jsonl")
    out = log_final_model(spec.uri, spec.run_id, torch.nn.Linear(3, 2), np.zeros((2, 3), np.float32), None, {})
    assert out["model_uri"].startswith("models:/m-")
    assert list(cwd.iterdir()) == []
    assert list(home.glob("mlartifacts/**/MLmodel")), sorted(str(p) for p in home.rglob("*"))[:20]
