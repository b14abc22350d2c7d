"""Ray Train's default callbacks, leaner (launch/controller.py): no DatasetManager actor without datasets, and no
PlacementGroupCleaner where the caller reaps the run's placement groups (a sweep's trials). Each was one more
Python process per run (per sweep trial, per restart for the first)."""

from __future__ import annotations

import pytest
from ray.train import RunConfig, ScalingConfig

from elastic_train.compat.ray_train import DatasetsCallback, PlacementGroupCleanerCallback
from elastic_train.launch.controller import DatasetsWithoutManager, NoDatasets
from elastic_train.launch.trainer import _Trainer


def _callbacks(tmp_path, reaped: bool) -> list:
    trainer = _Trainer(lambda: None, scaling_config=ScalingConfig(num_workers=1),
                       run_config=RunConfig(name="lean", storage_path=str(tmp_path)))
    trainer.placement_groups_reaped = reaped
    return trainer._create_default_callbacks()


def test_a_run_on_its_own_keeps_rays_cleaner_and_hands_out_datasets_without_a_manager(tmp_path):
    callbacks = _callbacks(tmp_path, reaped=False)
    kinds = [type(cb) for cb in callbacks]
    assert DatasetsWithoutManager in kinds and DatasetsCallback not in kinds
    assert PlacementGroupCleanerCallback in kinds
    datasets = next(cb for cb in callbacks if isinstance(cb, DatasetsWithoutManager))
    providers = datasets.before_init_train_context(workers=[object(), object()])["dataset_shard_provider"]
    assert len(providers) == 2 and all(isinstance(p, NoDatasets) for p in providers)
    datasets.after_worker_group_shutdown(None)  # nothing was started, so nothing to shut down (no error)


def test_a_sweep_trial_starts_no_placement_group_cleaner(tmp_path):
    kinds = [type(cb) for cb in _callbacks(tmp_path, reaped=True)]
    assert PlacementGroupCleanerCallback not in kinds and DatasetsWithoutManager in kinds


def test_asking_for_a_dataset_the_trainer_does_not_have_names_it():
    class Info:
        dataset_name = "train"

    with pytest.raises(KeyError, match="'train' not found"):
        NoDatasets().get_dataset_shard(Info())


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
