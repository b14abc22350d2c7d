"""Goodput counts the whole wall (DESIGN invariant 9): the parts of a driver's wall add up to it, none negative."""

from __future__ import annotations

import time
from dataclasses import asdict

import pytest

from elastic_train.launch.timeline import Timeline, process_start_unix
from elastic_train.train.goodput import WALL_PARTS, GoodputBook, wall_parts
from elastic_train.train.state import Goodput

T0 = 1_000_000.0  # the driver's launch


def _named_sum(parts: dict[str, float]) -> float:
    return sum(parts[k] for k in WALL_PARTS)


def _assert_honest(parts: dict[str, float], wall: float) -> None:
    assert parts["wall_s"] == pytest.approx(wall)
    assert _named_sum(parts) == pytest.approx(wall, abs=1e-6)
    assert all(parts[k] >= 0 for k in WALL_PARTS), parts
    assert parts["goodput_ratio"] == pytest.approx(parts["productive_s"] / wall)


def _train(book: GoodputBook, start: float, steps: range, step_s: float = 1.0) -> float:
    """One heartbeat per step of ``step_s`` productive seconds from ``start``; returns the time after them."""
    t = start
    for step in steps:
        t += step_s
        book.heartbeat(t, step, step_s, 0.0)
    return t


def test_a_clean_run_is_startup_steps_checkpoint_eval_and_teardown():
    book = GoodputBook(launched=T0)
    book.begin_attempt(T0 + 20.0, 2, None, None, [])  # workers up 20 s after launch
    book.loop_started(T0 + 25.0)
    book.first_step_done(T0 + 26.0)
    t = _train(book, T0 + 25.0, range(1, 11))  # 10 s of steps
    book.heartbeat(t + 1.5, 10, 0.0, 0.5, 1.0)  # the final checkpoint: 1 s validation, 0.5 s save + report
    parts = wall_parts(T0, T0 + 44.5, book.to_dict(), fit_ended=T0 + 40.0)
    _assert_honest(parts, 44.5)
    assert parts["startup_s"] == pytest.approx(25.0)
    assert (parts["productive_s"], parts["checkpoint_s"], parts["eval_s"]) == pytest.approx((10.0, 0.5, 1.0))
    assert parts["teardown_s"] == pytest.approx(44.5 - 36.5) and parts["other_s"] == pytest.approx(0.0)
    assert parts["goodput_ratio"] == pytest.approx(10.0 / 44.5)  # not productive / (time inside workers)
    assert book.totals.startup_s == pytest.approx(25.0)  # the worker's own book counts from the launch too


def test_the_final_checkpoints_tracking_flush_is_teardown_not_checkpoint_time():
    book = GoodputBook(launched=T0)
    book.begin_attempt(T0 + 20.0, 2, None, None, [])
    book.loop_started(T0 + 25.0)
    t = _train(book, T0 + 25.0, range(1, 11))
    # the final checkpoint blocked 2.5 s: 1 s validation, 1 s run summary (MLflow flush, hashes), 0.5 s save
    book.checkpointed(t + 2.5, 10, block_s=2.5, eval_s=1.0, finalize_s=1.0)
    assert (book.totals.checkpoints, book.totals.checkpoint_s, book.finalize_s) == (1, pytest.approx(0.5), 1.0)
    parts = wall_parts(T0, T0 + 44.5, book.to_dict(), fit_ended=T0 + 40.0)
    _assert_honest(parts, 44.5)
    assert parts["checkpoint_s"] == pytest.approx(0.5)
    assert parts["teardown_s"] == pytest.approx(44.5 - 37.5 + 1.0) and parts["other_s"] == pytest.approx(0.0)
    old = {k: v for k, v in book.to_dict().items() if k != "finalize_s"}  # a book from before the field
    assert wall_parts(T0, T0 + 44.5, old)["teardown_s"] == pytest.approx(7.0)


def test_a_restarted_run_names_the_lost_time_and_still_adds_up():
    book = GoodputBook(launched=T0)
    book.begin_attempt(T0 + 10.0, 2, None, None, [])
    book.loop_started(T0 + 12.0)
    t = _train(book, T0 + 12.0, range(1, 6))  # steps 1-5
    book.heartbeat(t + 1.0, 5, 0.0, 1.0)  # checkpoint at step 5 (T0 + 18)
    at_checkpoint = Goodput(**asdict(book.totals))
    t = _train(book, t + 1.0, range(6, 9))  # steps 6-8, last heartbeat at T0 + 21, then a worker dies
    event = book.begin_attempt(T0 + 30.0, 2, 5, at_checkpoint, [2])
    assert event["restart"] and event["recomputed_steps"] == 3
    book.loop_started(T0 + 33.0)
    t = _train(book, T0 + 33.0, range(6, 16))  # steps 6-15 again and on
    book.heartbeat(t + 1.0, 15, 0.0, 1.0)
    parts = wall_parts(T0, t + 3.0, book.to_dict(), fit_ended=t + 2.0)
    wall = t + 3.0 - T0
    _assert_honest(parts, wall)
    # from the last heartbeat (T0+21) to the loop's restart (T0+33), plus the 3 steps recomputed
    assert parts["restart_lost_s"] == pytest.approx(12.0 + 3.0)
    assert parts["productive_s"] == pytest.approx(5.0 + 10.0)
    assert parts["startup_s"] == pytest.approx(12.0) and parts["other_s"] == pytest.approx(0.0)


def test_a_resumed_job_counts_only_this_drivers_wall():
    earlier = Goodput(productive_s=500.0, checkpoint_s=20.0, startup_s=60.0)  # from the driver that died
    book = GoodputBook(launched=T0)
    book.begin_attempt(T0 + 8.0, 1, 40, earlier, [1])
    book.loop_started(T0 + 9.0)
    t = _train(book, T0 + 9.0, range(41, 46))
    parts = wall_parts(T0, t + 1.0, book.to_dict(), fit_ended=t + 0.5)
    _assert_honest(parts, t + 1.0 - T0)
    assert parts["productive_s"] == pytest.approx(5.0)
    assert book.totals.productive_s == pytest.approx(505.0)  # the run's book keeps its history


@pytest.mark.parametrize("fit_ended", [T0 + 3.0, None, T0 - 5.0, T0 + 99.0])
def test_nothing_trained_is_startup_and_teardown_never_negative(fit_ended):
    parts = wall_parts(T0, T0 + 4.0, None, fit_ended=fit_ended)
    _assert_honest(parts, 4.0)
    assert parts["productive_s"] == 0 and parts["goodput_ratio"] == 0


def test_clocks_out_of_order_give_no_negative_part():
    book = GoodputBook(launched=T0 + 5.0)  # a launch stamp later than the loop's start (clock stepped back)
    book.begin_attempt(T0, 1, None, None, [])
    book.loop_started(T0 + 1.0)
    _train(book, T0 + 1.0, range(1, 3))
    parts = wall_parts(T0 + 2.0, T0 + 2.5, book.to_dict())
    assert all(parts[k] >= 0 for k in WALL_PARTS), parts
    assert book.totals.startup_s == 0.0


def test_the_timeline_tiles_the_wall_and_never_runs_backwards():
    tl = Timeline(T0)
    tl.mark("a", T0 + 2.0)
    tl.mark("b", T0 + 1.0)  # earlier than the previous mark: an empty phase, not a negative one
    tl.mark("c", T0 + 5.0)
    phases = tl.phases()
    assert phases == [("a", 2.0), ("b", 0.0), ("c", 3.0)]
    assert sum(s for _, s in phases) == tl.last - tl.launched
    assert tl.phases(until="b") == [("a", 2.0), ("b", 0.0)] and tl.phases(since="b") == [("c", 3.0)]


def test_the_process_start_is_read_from_proc_and_is_in_the_past():
    start = process_start_unix()
    if start is None:
        pytest.skip("no /proc here")
    assert time.time() - 24 * 3600 * 365 < start <= time.time()
