"""bench/goodput_sim.py: deterministic, `auto` (the engine's own decision) within half a point of the searched
optimum at 8, 1,024 and 16,384 GPUs, and the fault campaign's measured goodput predicted within 3 points from
its schedule and measured costs (a stored report of seed 5, tests/cluster/test_chaos.py's worker-kind seed;
that test checks the same on the campaign it runs). In-process, ~1 s."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from bench import goodput_sim as sim

REPORT = Path(__file__).parent / "data" / "chaos_seed5.json"  # bench/chaos.py --seed 5 --faults 3 --epochs 2
# --kinds exit,raise,save,pair, 2026-12-05 on the shared 2-core box


def _run(*argv: str) -> dict:
    args, costs = sim.parse(["--days", "2", "--replicas", "3", *argv])
    return sim.at_scale(args, costs)


def test_deterministic_given_the_seed_and_auto_is_near_the_optimum_at_every_scale():
    a, b = _run("--seed", "3"), _run("--seed", "3")
    assert a == b
    assert [r["gpus"] for r in a["scales"]] == [8, 1024, 16384]
    for row in a["scales"]:
        assert row["auto_gap_points"] <= 0.5, row
        assert row["best_goodput_pct"] >= max(row["fixed_goodput_pct"].values()) - 1e-9
    big = a["scales"][-1]
    assert big["failures_mean"] > 5  # Llama 3's rate: one failure every ~3.1 h on 16,384 GPUs
    assert big["cluster_mtbf_s"] == pytest.approx(54 * 86400 / 419)


def test_a_failure_loses_the_work_since_the_checkpoint_and_one_recovery():
    costs = sim.Costs(startup_s=0.0, step_s=1.0, checkpoint_s=0.0, teardown_end_s=0.0,
                      phases={"recovery_s": 5.0}, growth={})
    # every 10 steps; a failure at t=25 loses steps 21-25 and 5 s of recovery; 100 s of wall
    out = sim.simulate(costs, 8, 8, [25.0], 100.0, every_steps=10)
    assert out.failures == 1 and out.lost_s == pytest.approx(10.0)
    assert out.productive_s == pytest.approx(90.0) and out.goodput == pytest.approx(0.9)
    # without failures the fixed interval only pays its checkpoints
    costs.checkpoint_s = 1.0
    assert sim.simulate(costs, 8, 8, [], 110.0, every_steps=10).goodput == pytest.approx(100 / 110)


def test_auto_uses_the_engines_decision():
    costs = sim.Costs(checkpoint_s=0.5, step_s=0.1)
    rng = random.Random(0)
    trace = sim.poisson_trace(rng, 128, 3600.0 * 128, 86400.0)
    out = sim.simulate(costs, 1024, 8, trace, 86400.0, every_steps=None, prior_mtbf_gpu_s=3600.0 * 1024)
    # the prior alone: M = 3600 s, T = sqrt(2 * 0.5 * 3600) = 60 s = 600 steps; the run's record moves it
    assert 300 <= out.final_every_steps <= 1200
    assert math.isclose(sim.interval.young_daly_s(0.5, 3600.0), 60.0)


def test_the_campaign_is_predicted_within_3_points():
    report = json.loads(REPORT.read_text())
    pred = sim.predict_campaign(report)
    assert abs(pred["predicted_goodput_pct"] - pred["measured_goodput_pct"]) <= 3.0, pred
    assert pred["predicted_restarts"] == pred["measured_restarts"] == 3
    assert pred["predicted_wall_s"] == pytest.approx(pred["measured_wall_s"], rel=0.05)


def test_bad_flags_exit_2():
    for argv in (["--trace", "poisson"], ["--growth", "nope=log"], ["--gpus", "x"]):
        with pytest.raises(SystemExit) as e:
            sim.parse(argv)
        assert e.value.code == 2
