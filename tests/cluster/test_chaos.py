"""The fault campaign in CI: a few fixed seeds of bench/chaos.py, each a short schedule of mixed faults.

One multi-node ``ray.cluster_utils.Cluster`` (a head and one worker node, 1 CPU each), one real ``mlflow server``
and one fault-free reference run serve every seed. Each seed drives ``python -m jobs.train`` as a subprocess
with ``scaling.num_workers=[1,2]`` over 2 epochs (22 steps, a checkpoint every 5) and fires three faults drawn
from it (bench/chaos.py ``draw_schedule``); between them the seeds cover every kind but ``node`` (``drain``
removes and re-adds a node after its preemption checkpoint; the long campaign draws all eight):

    22: mlflow outage at 7, death inside a checkpoint save at 9, driver SIGKILLed at 15 and resumed by name
    12: rank 1 raises at 2, a node drained for preemption at 6 (removed, re-added at 9), mlflow outage at 10
     5: (worker kinds only) a pair at 9 and 10, closer than the 5-step checkpoint interval; a death inside a
        checkpoint save at 13

Seed 5 runs in ``make test``; seed 12 moved to ``make test-long`` with 22 (2026-12-05, suite time). Before,
seeds 12 and 5 ran in ``make test`` (seed 5 alone, with the world and the reference run: 82 s on the idle
2-core box, 2026-12-03; ~45 s more than seed 12 alone, since they share both); seed 22 in ``make test-long`` too.
The end checks are bench/chaos.py's (``passed``): the run finished, every fault fired, every epoch consumed
every sample exactly once, the train loss within 1e-4 relative of the reference (params bitwise equal when the
world size never changed), one MLflow run FINISHED with every step's metrics once and ``restarts`` right, and
goodput parts that sum to the wall.
"""

from __future__ import annotations

import json

import pytest

# The campaign's own waits are bounded (bench/chaos.py: each run 900 s); under heavy load a seed has taken
# 600 s, the suite's default per-test limit, so this module has its own
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

SEEDS = {22: {"mlflow", "save", "driver"}, 12: {"raise", "drain", "mlflow"}, 5: {"pair", "save"}}
WORKER_ONLY = {5}  # drawn from the worker kinds only (restarts inside one driver: the cheap seed)
EPOCHS, WORKERS, EVERY, DELAY = 2, 2, 5, 0.1


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from bench.chaos import World

    w = World.start(tmp_path_factory.mktemp("chaos"), nodes=1)
    yield w
    w.stop()


@pytest.mark.parametrize("seed", [
    # raise, drain, mlflow: `make test-long` since 2026-12-05 (162-171 s in make test, which ran at 59 min here and
    # 66 min in CI against its ~25 min budget); drain is in tests/cluster/test_elastic.py, an MLflow outage in
    # tests/e2e/test_tracking.py
    pytest.param(12, marks=pytest.mark.long),
    # two workers killed one step apart (a pair: closer than a checkpoint interval) at 9-10, a death inside a
    # checkpoint save at 13: worker kinds only, in `make test`
    5,
    # mlflow, save, driver: `make test-long`; it found the orphaned sender (tests/e2e/test_orphan_sender.py)
    pytest.param(22, marks=[pytest.mark.long, pytest.mark.soak]),
])
# ~80 s: a fault-free reference run, then the campaign: each of its faults is a worker group restart (~5-10 s on
# 2 cores), and the run must go on to its end to be compared with the reference bit for bit
def test_a_short_mixed_fault_campaign_survives_and_loses_nothing(world, seed):
    from bench.chaos import KINDS, WORKER_KINDS, campaign, passed

    kinds = WORKER_KINDS if seed in WORKER_ONLY else KINDS
    report = campaign(world, seed, n_faults=3, epochs=EPOCHS, workers=WORKERS, every=EVERY, delay=DELAY,
                      kinds=kinds)
    if problems := passed(report):
        pytest.fail(f"{problems}\n{json.dumps(report, indent=1)}")
    t = report["totals"]
    assert set(t["kinds"]) == SEEDS[seed] and t["injected"] == t["survived"] == 3
    assert t["samples_lost"] == 0 and t["worst_recovery_s"] is not None
    for row in report["faults"]:
        if row["kind"] != "mlflow":
            # a restart resumes from the newest complete checkpoint: one interval, and the one being written
            assert row["steps_lost"] <= 2 * EVERY and "phases_s" in row, row
    if "driver" in SEEDS[seed]:
        assert t["driver_launches"] == 2
    if "drain" in SEEDS[seed]:
        drain = next(r for r in report["faults"] if r["kind"] == "drain")
        assert drain["drain_accepted"] and drain["readded_step"] >= drain["fired_step"]
    # the goodput simulator (bench/goodput_sim.py) predicts this campaign's goodput from its schedule and its
    # measured costs within 3 points (issue 35; milliseconds: no run of its own)
    from bench.goodput_sim import predict_campaign

    pred = predict_campaign(report)
    assert abs(pred["predicted_goodput_pct"] - pred["measured_goodput_pct"]) <= 3.0, pred
