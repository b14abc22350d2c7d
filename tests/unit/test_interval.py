"""checkpoint.every_steps=auto (train/interval.py and the policy that applies it): the Young–Daly choice, the
Gamma–Poisson failure rate, the floor, today's cadence without failures or a prior, and a resume that decides
from the goodput totals a checkpoint carries. In-process, milliseconds."""

from __future__ import annotations

import math

import pytest

from elastic_train.config import load
from elastic_train.train import interval
from elastic_train.train.policy import CheckpointPolicy
from elastic_train.train.state import Goodput, Progress


def test_young_daly_is_sqrt_2_c_m():
    assert interval.young_daly_s(0.5, 3600.0) == pytest.approx(math.sqrt(2 * 0.5 * 3600))
    c = interval.choose(checkpoint_s=2.0, checkpoints=4, step_s=0.1, restarts=2, wall_s=7200.0,
                        prior_mtbf_s=None, workers=8)
    assert c.checkpoint_cost_s == 0.5 and c.mtbf_s == 3600.0  # the run's own record: 2 failures in 2 h
    assert c.every_steps == round(math.sqrt(2 * 0.5 * 3600) / 0.1) == 600


def test_no_failure_and_no_prior_keeps_the_configured_cadence():
    assert interval.mtbf(0, 1e6, None, 8) is None
    assert interval.choose(checkpoint_s=1.0, checkpoints=1, step_s=0.1, restarts=0, wall_s=1e4, prior_mtbf_s=None,
                           workers=2) is None
    # nothing measured yet: no checkpoint, no step time
    assert interval.choose(checkpoint_s=0.0, checkpoints=0, step_s=0.1, restarts=1, wall_s=10, prior_mtbf_s=None,
                           workers=2) is None
    assert interval.choose(checkpoint_s=1.0, checkpoints=1, step_s=None, restarts=1, wall_s=10, prior_mtbf_s=None,
                           workers=2) is None


def test_the_prior_is_per_worker_and_the_run_record_takes_over():
    # prior only: one pseudo-failure over mtbf/W pseudo-seconds
    assert interval.mtbf(0, 0.0, 80_000.0, 8) == pytest.approx(10_000.0)
    # a young run with one failure barely moves it; a long record dominates
    assert interval.mtbf(1, 100.0, 80_000.0, 8) == pytest.approx((10_000 + 100) / 2)
    assert interval.mtbf(100, 100 * 600.0, 80_000.0, 8) == pytest.approx((10_000 + 60_000) / 101)
    # Llama 3's rate: 419 failures in 54 days on 16,384 GPUs ~ one every 3.1 h
    per_gpu = 54 * 86400 * 16384 / 419
    assert interval.mtbf(0, 0.0, per_gpu, 16384) == pytest.approx(54 * 86400 / 419)


def test_the_floor_holds():
    c = interval.choose(checkpoint_s=0.001, checkpoints=1, step_s=10.0, restarts=5, wall_s=50.0, prior_mtbf_s=None,
                        workers=1, floor=7)
    assert c.every_steps == 7
    assert "every 7 steps" in c.line() and "MTBF 10 s" in c.line()


def test_choose_from_totals_reads_the_goodput_book():
    t = Goodput(productive_s=100.0, checkpoint_s=1.5, eval_s=0.5, restart_lost_s=20.0, startup_s=10.0,
                restarts=2, checkpoints=4)
    c = interval.choose_from_totals(t, global_step=1000, prior_mtbf_s=None, workers=2)
    assert c.step_s == pytest.approx(0.1) and c.checkpoint_cost_s == pytest.approx(0.5)
    assert c.wall_s == pytest.approx(132.0) and c.mtbf_s == pytest.approx(66.0)
    assert c.every_steps == round(math.sqrt(2 * 0.5 * 66.0) / 0.1)


def _policy(*overrides):
    cfg = load("configs/digits.yaml", list(overrides))
    return CheckpointPolicy(cfg, lambda: None, lambda _: None)


def test_auto_starts_on_the_default_cadence_and_a_proposal_applies_at_the_next_sync_point():
    p = _policy("checkpoint.every_steps=auto")
    assert p.every_steps is None and p.every_seconds == 120.0  # today's default until a choice is made
    assert not p.is_sync_point(7, 3)
    p.propose(7)
    flags = p.flags()
    assert flags["every_steps"] == 7.0 and p.every_steps is None  # not before every rank has it
    p.synced(flags)
    assert p.every_steps == 7 and p.every_seconds is None and p.is_sync_point(14, 3)
    prog = Progress(epoch=0, step_in_epoch=3, global_step=14)
    assert p.reason({**p.flags(), "time_checkpoint": True}, prog, epoch_end=False) == "every 7 steps"
    p.propose(7)  # unchanged: nothing travels
    assert p.flags()["every_steps"] == 0.0


def test_every_steps_accepts_auto_an_int_or_null_only():
    assert load("configs/digits.yaml", ["checkpoint.every_steps=5"]).checkpoint.every_steps == 5
    for bad in ("0", "-3", "soon"):
        with pytest.raises(Exception, match="checkpoint.every_steps"):
            load("configs/digits.yaml", [f"checkpoint.every_steps={bad}"])


def test_sync_points_are_their_own_cadence_and_every_log_point_is_one():
    p = _policy("tracking.log_every_steps=100", "train.sync_every_steps=4")
    assert p.is_sync_point(8, 3) and not p.is_log_point(8, 3)  # the clock is read here, nothing is logged
    assert not p.is_sync_point(7, 3)
    assert p.is_log_point(100, 3) and p.is_sync_point(100, 3) and p.is_log_point(5, 0)  # log cadence, epoch end
    default = _policy()  # equal cadences: the same steps as before the setting existed
    assert all(default.is_sync_point(s, s % 7) == default.is_log_point(s, s % 7) for s in range(1, 200))
