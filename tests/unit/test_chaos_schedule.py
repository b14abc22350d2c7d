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


def _jsonl(path, records) -> None:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_a_recovery_splits_at_the_controllers_events_into_phases_that_add_up(tmp_path):
    from bench.chaos import recovery_phases

    t = 1000.0  # the fault; an earlier restart's events (before it) must be ignored
    _jsonl(tmp_path / "controller.jsonl", [
        {"event": "failure_decision", "unix": t - 50}, {"event": "shutdown_done", "unix": t - 49},
        {"event": "failure_decision", "unix": t + 0.3}, {"event": "shutdown_done", "unix": t + 0.4},
        {"event": "group_start", "unix": t + 0.45}, {"event": "group_ready", "unix": t + 7.0},
        {"event": "training_started", "unix": t + 7.05}])
    _jsonl(tmp_path / "phases.rank0.jsonl", [
        {"event": "context", "unix": t + 5.5, "pid": 7, "process_start": t + 1.0},
        {"event": "entered", "unix": t + 7.1, "at": t + 7.1, "pid": 7, "process_start": t + 1.0},
        {"event": "built", "unix": t + 7.2, "pid": 7}, {"event": "restored", "unix": t + 7.25, "pid": 7},
        {"event": "first_step", "unix": t + 7.3, "pid": 7, "step": 41}])
    out = recovery_phases({"unix": t, "fired_step": 60}, tmp_path)
    split = out["ray_train_phases_s"]
    assert split == {"detection_s": 0.3, "teardown_s": 0.1, "placement_s": 0.6, "process_start_s": 4.5,
                     "process_group_s": 1.5, "dispatch_s": 0.1}
    p = out["phases_s"]
    assert abs(sum(split.values()) - (p["ray_restart_s"] + p["worker_setup_s"])) < 0.02
    assert out["steps_lost"] == 20 and out["recovery_s"] == 7.3


def test_without_the_controllers_events_the_recovery_keeps_its_coarse_phases(tmp_path):
    from bench.chaos import recovery_phases

    _jsonl(tmp_path / "phases.rank0.jsonl", [
        {"event": "entered", "unix": 12.0, "at": 12.0, "pid": 3, "process_start": 5.0},
        {"event": "built", "unix": 13.0, "pid": 3}, {"event": "first_step", "unix": 14.0, "pid": 3, "step": 5}])
    out = recovery_phases({"unix": 2.0, "fired_step": 6}, tmp_path)
    assert "ray_train_phases_s" not in out and out["phases_s"]["ray_restart_s"] == 3.0


def test_the_hosts_campaign_draws_head_loss_among_every_kind():
    """--hosts draws from every kind, ``head`` (a head loss: tests/hosts) among them, each in a window of its own;
    seed 4, which make test-long runs, draws two head losses, a host loss, a partition and two driver kills."""
    from bench.chaos import HOSTS_KINDS

    assert "head" in HOSTS_KINDS and "head" in CAMPAIGN_KINDS and "head" not in KINDS  # not the one-host Cluster's
    s = draw_schedule(4, 20, 88, every=5, workers=2, kinds=HOSTS_KINDS)
    assert {"head", "host", "partition", "driver"} <= {f["kind"] for f in s} <= set(HOSTS_KINDS)
    assert [f["step"] for f in s if f["kind"] == "head"] == [33, 42]
    windows = sorted((f["step"], f["until"]) for f in s if f["kind"] in CAMPAIGN_KINDS)
    assert all(a[1] < b[0] for a, b in zip(windows, windows[1:], strict=False))
