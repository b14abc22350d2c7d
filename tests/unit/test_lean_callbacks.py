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
