"""Ray Train's environment knobs come from each run's own config: a second run in one process (a notebook, a test
session, sweep trials) does not inherit the first run's values; a value the user exported still wins."""

from __future__ import annotations

import os

from elastic_train.compat.ray_train import HEALTH_CHECK_ENV, START_TIMEOUT_ENV
from elastic_train.config import load
from elastic_train.launch import trainer
from tests.conftest import ROOT


def _cfg(*overrides: str):
    return load(str(ROOT / "configs" / "digits.yaml"), list(overrides))


def test_each_run_sets_its_own_start_timeout_and_an_exported_value_wins(monkeypatch):
    monkeypatch.setattr(trainer, "_EXPORTED", {HEALTH_CHECK_ENV: "0.2"})
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    monkeypatch.setenv(HEALTH_CHECK_ENV, "0.2")
    trainer._ray_train_env(_cfg("failure.worker_start_timeout_s=15", "failure.health_check_interval_s=2"))
    assert os.environ[START_TIMEOUT_ENV] == "15.0" and os.environ[HEALTH_CHECK_ENV] == "0.2"
    trainer._ray_train_env(_cfg())  # the next run: its own (default) timeout, not the last run's 15 s
    assert os.environ[START_TIMEOUT_ENV] == "30.0" and os.environ[HEALTH_CHECK_ENV] == "0.2"
