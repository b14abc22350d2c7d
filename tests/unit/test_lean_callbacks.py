"""Ray Train's default callbacks, leaner (launch/controller.py, feature ``lean_callbacks``): no DatasetManager
actor in a run that reads no Ray Data, and no PlacementGroupCleaner where the caller reaps the run's placement
groups (a sweep's trials, an embedded Ray). Each was one more Python process per run (per sweep trial, per restart
for the first)."""

from __future__ import annotations

import pytest
from ray.train import RunConfig, ScalingConfig

from elastic_train.compat.ray_train import DatasetsCallback, PlacementGroupCleanerCallback
from elastic_train.launch.trainer import _Trainer


@pytest.fixture(autouse=True)
def _on(monkeypatch):
    from elastic_train.compat import features

    monkeypatch.setenv(features.SWITCH_ENV, "on")


def _callbacks(tmp_path, reaped: bool, ray_data: bool = False) -> list:
    trainer = _Trainer(lambda: None, scaling_config=ScalingConfig(num_workers=1),
                       run_config=RunConfig(name="lean", storage_path=str(tmp_path)))
    trainer.placement_groups_reaped, trainer.ray_data = reaped, ray_data
    return [type(cb) for cb in trainer._create_default_callbacks()]


def test_the_public_path_keeps_rays_default_callbacks(tmp_path, monkeypatch):
    from elastic_train.compat import features

    monkeypatch.setenv(features.SWITCH_ENV, "off")
    kinds = _callbacks(tmp_path, reaped=True)
    assert DatasetsCallback in kinds and PlacementGroupCleanerCallback in kinds


def test_a_run_on_its_own_keeps_rays_cleaner_and_a_run_without_ray_data_no_datasets_callback(tmp_path):
    kinds = _callbacks(tmp_path, reaped=False)
    assert DatasetsCallback not in kinds and PlacementGroupCleanerCallback in kinds


def test_a_run_that_reads_ray_data_keeps_the_datasets_callback_its_data_context_travels_by(tmp_path):
    assert DatasetsCallback in _callbacks(tmp_path, reaped=True, ray_data=True)


def test_a_sweep_trial_starts_no_placement_group_cleaner(tmp_path):
    assert PlacementGroupCleanerCallback not in _callbacks(tmp_path, reaped=True)


def test_an_embedded_ray_run_starts_neither_cleaner_nor_preemption_watcher_and_a_cluster_run_keeps_both(
        tmp_path, monkeypatch):
    """An embedded Ray is one node, the driver's own, gone with it: Ray Train's PlacementGroupCleaner (a detached
    process per run) and PreemptionWatcher (a process per worker group) guard against nothing there."""
    import os

    from elastic_train.compat.ray_train import PREEMPTION_WATCHER_ENV
    from elastic_train.config import load
    from elastic_train.launch import trainer as trainer_mod
    from elastic_train.launch.context import RunContext
    from elastic_train.launch.reach import EMBEDDED
    from elastic_train.train.worker import WorkerArgs

    monkeypatch.setattr(trainer_mod, "_WRITTEN", {})
    monkeypatch.delenv(PREEMPTION_WATCHER_ENV, raising=False)  # restored after the test
    cfg = load("configs/digits.yaml", [])
    for target, lean in ((EMBEDDED, True), ("local head (ray start)", False)):
        ctx = RunContext(cfg, "lean", tmp_path, str(tmp_path), False, None, 0.0, ray_target=target)
        built = trainer_mod.build_trainer(ctx)
        kinds = [type(cb) for cb in built._create_default_callbacks()]
        assert (PlacementGroupCleanerCallback not in kinds) is lean, target
        assert (os.environ.get(PREEMPTION_WATCHER_ENV) == "0") is lean, target  # the controller reads this
        assert WorkerArgs(**built.train_loop_config).watch_preemption is not lean, target  # and no barrier


def test_where_nothing_watches_for_preemption_no_sync_point_asks():
    from elastic_train.config import load
    from elastic_train.train.policy import PREEMPTION_CHECK_S, CheckpointPolicy

    asked = []
    watched = CheckpointPolicy(load("configs/digits.yaml", []), lambda: asked.append(1), lambda _: None)
    unwatched = CheckpointPolicy(load("configs/digits.yaml", []), None, lambda _: None)
    for p in (watched, unwatched):
        p.last_preemption_check -= PREEMPTION_CHECK_S + 1  # due
    assert watched.flags()["check_preemption"] is True
    assert unwatched.flags()["check_preemption"] is False and unwatched._preempted() is False
