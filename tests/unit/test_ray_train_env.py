"""Ray Train's environment knobs come from each run's own config: a second run in one process (a notebook, a test
session, sweep trials) does not inherit the first run's values; a value the user exported still wins."""

from __future__ import annotations

import os
from pathlib import Path

from elastic_train.compat.ray_train import HEALTH_CHECK_ENV, PREEMPTION_WATCHER_ENV, START_TIMEOUT_ENV
from elastic_train.config import load
from elastic_train.launch import trainer
from elastic_train.launch.context import RunContext
from elastic_train.launch.reach import EMBEDDED
from tests.conftest import ROOT


def _ctx(*overrides: str, ray_target: str | None = EMBEDDED) -> RunContext:
    cfg = load(str(ROOT / "configs" / "digits.yaml"), list(overrides))
    return RunContext(cfg, "r", Path("/nonexistent"), "/nonexistent", False, None, 0.0, ray_target=ray_target)


def test_each_run_sets_its_own_start_timeout_and_an_exported_value_wins(monkeypatch):
    monkeypatch.setattr(trainer, "_WRITTEN", {})  # a fresh process, where the user exported one knob
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    monkeypatch.setenv(HEALTH_CHECK_ENV, "0.2")  # the user's
    trainer._ray_train_env(_ctx("failure.worker_start_timeout_s=15", "failure.health_check_interval_s=2"))
    assert os.environ[START_TIMEOUT_ENV] == "15.0" and os.environ[HEALTH_CHECK_ENV] == "0.2"
    trainer._ray_train_env(_ctx())  # the next run: its own (default) timeout, not the last run's 15 s
    assert os.environ[START_TIMEOUT_ENV] == "30.0" and os.environ[HEALTH_CHECK_ENV] == "0.2"


def test_no_preemption_watcher_on_an_embedded_ray_and_ray_s_default_on_a_cluster(monkeypatch):
    monkeypatch.setattr(trainer, "_WRITTEN", {})
    monkeypatch.delenv(PREEMPTION_WATCHER_ENV, raising=False)
    trainer._ray_train_env(_ctx())
    assert os.environ[PREEMPTION_WATCHER_ENV] == "0"
    trainer._ray_train_env(_ctx(ray_target="local head (ray start)"))  # a later run in this process joins a cluster
    assert PREEMPTION_WATCHER_ENV not in os.environ  # Ray's default (on), not the embedded run's "0"
    monkeypatch.setenv(PREEMPTION_WATCHER_ENV, "1")  # the user, between two runs of one process
    trainer._ray_train_env(_ctx())
    assert os.environ[PREEMPTION_WATCHER_ENV] == "1"  # what the user set last wins


def test_what_the_user_sets_between_two_runs_wins_and_the_switch_leaves_rays_defaults(monkeypatch):
    """A notebook: a first run, then the user exports a knob, then a second run (issue 51 item 4); and with every
    internal off the knobs are not set at all (Ray's own defaults)."""
    from elastic_train.compat import features

    monkeypatch.setattr(trainer, "_WRITTEN", {})
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(HEALTH_CHECK_ENV, raising=False)
    trainer._ray_train_env(_ctx("failure.worker_start_timeout_s=15"))
    assert os.environ[START_TIMEOUT_ENV] == "15.0"
    monkeypatch.setenv(START_TIMEOUT_ENV, "45")
    trainer._ray_train_env(_ctx("failure.worker_start_timeout_s=15"))
    assert os.environ[START_TIMEOUT_ENV] == "45"
    monkeypatch.setattr(trainer, "_WRITTEN", {})
    monkeypatch.delenv(START_TIMEOUT_ENV)
    monkeypatch.delenv(HEALTH_CHECK_ENV)
    monkeypatch.setenv(features.SWITCH_ENV, "off")
    trainer._ray_train_env(_ctx())
    assert START_TIMEOUT_ENV not in os.environ and HEALTH_CHECK_ENV not in os.environ


def test_ray_train_hands_our_knobs_to_its_controller():
    """Ray Train copies only the variables it lists from the driver into its controller's environment: a knob
    missing there would be set here and silently ignored there."""
    from ray.train.v2._internal.constants import ENV_VARS_TO_PROPAGATE

    assert {HEALTH_CHECK_ENV, START_TIMEOUT_ENV, PREEMPTION_WATCHER_ENV} <= set(ENV_VARS_TO_PROPAGATE)


def test_what_the_user_sets_between_two_runs_in_one_process_wins(monkeypatch):
    """A notebook: one run, then the user exports a knob, then a second run (issue 51 item 4). The value read at
    import must not decide: the user's latest value wins, and once the user removes it the config's applies."""
    monkeypatch.setattr(trainer, "_WRITTEN", {})
    monkeypatch.delenv(START_TIMEOUT_ENV, raising=False)
    trainer._ray_train_env(_ctx("failure.worker_start_timeout_s=15"))
    assert os.environ[START_TIMEOUT_ENV] == "15.0"  # the config's, nobody exported one
    monkeypatch.setenv(START_TIMEOUT_ENV, "99")  # the user, between the two runs
    trainer._ray_train_env(_ctx("failure.worker_start_timeout_s=15"))
    assert os.environ[START_TIMEOUT_ENV] == "99"
    monkeypatch.setenv(START_TIMEOUT_ENV, "7")  # and changes their mind
    trainer._ray_train_env(_ctx())
    assert os.environ[START_TIMEOUT_ENV] == "7"
    monkeypatch.delenv(START_TIMEOUT_ENV)  # gone: this run's config again
    trainer._ray_train_env(_ctx("failure.worker_start_timeout_s=12"))
    assert os.environ[START_TIMEOUT_ENV] == "12.0"
