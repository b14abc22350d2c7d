"""An elastic sweep trial's size: its floor (reserved by the sweep's driver) plus the extra the coordinator
reserves to its Train run (elastic_train/sweep/elastic.py). No Ray cluster: the policy's arithmetic only."""

from __future__ import annotations

from ray.train import ScalingConfig

from elastic_train.config import load
from elastic_train.sweep.elastic import TrialScalingPolicy
from elastic_train.sweep.tuner import trial_floor


def policy(lo: int, hi: int) -> TrialScalingPolicy:
    return TrialScalingPolicy(ScalingConfig(num_workers=(lo, hi), resources_per_worker={"CPU": 1.0}), "t_00000")


def test_a_trial_asks_only_for_what_it_may_grow_by_and_counts_its_floor():
    p = policy(2, 4)
    assert p._get_num_workers_for_resource_request() == 2
    assert p._count_possible_workers({}) == 2  # nothing extra reserved: its floor
    assert p._count_possible_workers({"a": {"CPU": 1.0}}) == 3
    assert p._count_possible_workers({"a": {"CPU": 1.0}, "b": {"CPU": 0.5}}) == 3  # half a worker is none
    assert p._count_possible_workers({"a": {"CPU": 9.0}}) == 4  # never beyond max


def test_a_trials_floor_is_its_driver_and_its_minimum_workers():
    cfg = load(None, ["scaling.num_workers=[2, 4]", "scaling.use_gpu=false", "sweep.trial_cpus=0.5",
                      "sweep.space={train.lr: {type: choice, values: [0.1, 0.01]}}"])
    assert trial_floor(cfg, False, {"train.lr": 0.1}) == [{"CPU": 0.5}, {"CPU": 1.0}, {"CPU": 1.0}]
