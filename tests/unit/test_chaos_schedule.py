"""bench/chaos.py's schedule: drawn from the seed, mixed, windows apart, and a fault spec the workers accept."""

from __future__ import annotations

import pytest

from bench.chaos import CAMPAIGN_KINDS, KINDS, WORKER_KINDS, draw_schedule, fault_spec
from elastic_train.train.faults import FaultPlan


@pytest.mark.parametrize("seed, n, total", [(7, 20, 88), (22, 3, 22), (12, 3, 22), (3, 6, 33)])
def test_a_schedule_is_a_pure_function_of_its_seed_and_keeps_its_rules(seed, n, total, tmp_path):
    s = draw_schedule(seed, n, total, every=5, workers=2)
    assert s == draw_schedule(seed, n, total, every=5, workers=2)
    assert len(s) == n
    steps = [f["step"] for f in s]
    assert steps == sorted(steps) and len(set(steps)) == n and all(2 <= k <= total - 2 for k in steps)
    kinds = {f["kind"] for f in s}
    assert kinds & set(WORKER_KINDS) and kinds & set(CAMPAIGN_KINDS)  # mixed
    windows = sorted((f["step"], f["until"]) for f in s if f["kind"] in CAMPAIGN_KINDS)
    assert all(a[1] < b[0] for a, b in zip(windows, windows[1:], strict=False))  # never overlapping
    assert all(f["until"] < total - 1 for f in s if f["kind"] in CAMPAIGN_KINDS)
    assert all(f["step"] <= total // 2 for f in s if f["kind"] == "mlflow")
    pairs = [f["step"] for f in s if f["kind"] == "pair"]
    assert len(pairs) % 2 == 0 and all(0 < b - a < 5 for a, b in zip(pairs[::2], pairs[1::2], strict=True))
    first_loss = min((f["step"] for f in s if f["kind"] in ("node", "drain")), default=total)
    assert all(f["rank"] == 0 for f in s if f["kind"] in WORKER_KINDS and f["step"] >= first_loss)
    plan = FaultPlan.parse(fault_spec(s, tmp_path, delay=0.1))
    assert [f.step for f in plan.faults] == [f["step"] for f in s if f["kind"] in WORKER_KINDS]
    assert plan.delay == 0.1 and plan.markers == str(tmp_path)


def test_the_long_campaign_draws_every_kind():
    assert {f["kind"] for f in draw_schedule(7, 20, 88, every=5, workers=2)} == set(KINDS)


def test_a_restricted_schedule_keeps_to_its_kinds():
    s = draw_schedule(1, 4, 22, every=5, workers=2, kinds=("driver", "raise"))
    assert {f["kind"] for f in s} == {"driver", "raise"}


@pytest.mark.parametrize("total", [22, 33, 88])
def test_a_node_or_drain_window_leaves_room_to_re_add_the_node_before_the_end(total):
    # Seen: a node removed at 83 of 88 (re-add due at 86) and a drain whose removal waited for its checkpoint:
    # the run ended before the node came back (no `readded_step`). Every seed keeps 3 steps after the window.
    n = 20 if total == 88 else 3
    losses = [f for seed in range(200) for f in draw_schedule(seed, n, total, every=5, workers=2)
              if f["kind"] in ("node", "drain")]
    assert losses and all(f["until"] + 3 <= total - 2 for f in losses)
    assert max(f["until"] for f in losses) == total - 5  # the rule binds, it does not just shrink the range
    tight = draw_schedule(1, 2, 12, every=5, workers=2, kinds=("node", "exit"), readd_room=5)
    assert [(f["kind"], f["step"], f["until"]) for f in tight if f["kind"] == "node"] == [("node", 2, 5)]  # only room
