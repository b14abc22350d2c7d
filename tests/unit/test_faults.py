"""Fault specs (elastic_train.train.faults): several faults per run, the new kinds, malformed specs exit 2.

``exit`` and ``save`` faults end the process (``os._exit``), so they fire in a forked child here and the test
reads its exit code and marker; ``raise`` fires in this process."""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import pytest

from elastic_train.errors import ConfigError
from elastic_train.train.faults import FAULT_ENV, Fault, FaultHook, FaultPlan


def test_several_faults_and_globals_in_one_spec(tmp_path):
    plan = FaultPlan.parse(f"step=7,rank=1,mode=exit ; step=9,mode=raise;step=12,mode=save,marker={tmp_path}/s;"
                           f" delay=0.1; markers={tmp_path}/m")
    assert plan.delay == 0.1
    assert plan.faults == (
        Fault(7, 1, "exit", f"{tmp_path}/m/fault-0.json"),
        Fault(9, 0, "raise", f"{tmp_path}/m/fault-1.json"),
        Fault(12, 0, "save", f"{tmp_path}/s"),
    )
    assert [f.step for f in plan.for_rank(0).faults] == [9, 12]


def test_the_single_fault_syntax_still_works():
    plan = FaultPlan.parse("step=13,rank=1,marker=/tmp/x,mode=exit,delay=0.25")
    assert plan.faults == (Fault(13, 1, "exit", "/tmp/x"),) and plan.delay == 0.25
    assert FaultPlan.parse("delay=0.3") == FaultPlan((), 0.3)
    assert FaultPlan.parse(None) == FaultPlan.parse("  ") == FaultPlan()


def test_the_delay_ends_for_good_once_its_path_exists(tmp_path, monkeypatch):
    """A test that has seen what it waited for lets the run finish at full speed (tests/hosts)."""
    import elastic_train.train.faults as faults

    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    fast = tmp_path / "fast"
    hook = FaultHook.parse(f"delay=0.25,delay_until={fast}; step=99,rank=1", rank=0)
    assert hook.plan.delay_until == str(fast)  # kept by for_rank
    hook.maybe_fire(1)
    hook.maybe_fire(2)
    fast.touch()
    hook.maybe_fire(3)
    fast.unlink()
    hook.maybe_fire(4)
    assert slept == [0.25, 0.25]
    assert FaultHook.parse(f"delay=0.25,delay_until={fast}", rank=1).delay == 0.25  # a new worker checks again


@pytest.mark.parametrize("spec, needle", [
    ("step=x,rank=1", "step=x: not an integer"),
    ("step=3,mode=explode", "mode=explode: one of exit, raise, save"),
    ("step=3,rnak=1", "unknown key 'rnak'"),
    ("rank=1,mode=exit", "fault 1 has no step"),
    ("step=3;step", "'step': write key=value"),
    ("step=0", "step must be >= 1"),
    ("delay=-1", "delay=-1: must be >= 0"),
    ("delay=soon", "delay=soon: not a number"),
    ("step=3,when=later,marker=/tmp/m", "when=later: one of spares-warm"),
])
def test_malformed_specs_are_config_errors_naming_the_variable(spec, needle):
    with pytest.raises(ConfigError) as e:
        FaultPlan.parse(spec)
    assert e.value.field == FAULT_ENV and e.value.value == spec and needle in str(e.value)


def test_a_malformed_spec_exits_2_before_anything_starts(monkeypatch, capsys, tmp_path):
    from jobs.train import main

    monkeypatch.setenv(FAULT_ENV, "step=3,mode=explode")
    monkeypatch.setenv("ELASTIC_TRAIN_HOME", str(tmp_path))
    assert main(["--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {FAULT_ENV}=") and "mode=explode" in err and len(err.strip().splitlines()) == 1


def test_raise_fires_once_per_marker_and_records_it(tmp_path):
    hook = FaultHook.parse(f"step=3,mode=raise,marker={tmp_path}/r", rank=0)
    hook.maybe_fire(2)
    with pytest.raises(RuntimeError, match="injected fault at step 3"):
        hook.maybe_fire(3)
    record = json.loads((tmp_path / "r").read_text())
    assert record["step"] == 3 and record["mode"] == "raise" and record["unix"] > 0
    hook.maybe_fire(3)  # the restarted worker passes it


def test_a_spares_warm_fault_waits_for_the_nodes_warm_spares_then_fires(tmp_path, monkeypatch):
    """Outside a Train worker there are no spares: at its step it waits out its bound, then fires one step later."""
    import elastic_train.train.faults as faults

    monkeypatch.setattr(faults, "WHEN_BOUND_S", 0.5)
    hook = FaultHook.parse(f"step=3,mode=raise,when=spares-warm,marker={tmp_path}/w", rank=0)
    hook.maybe_fire(2)
    started = time.monotonic()
    hook.maybe_fire(3)  # waits, then arms
    assert time.monotonic() - started >= 0.5
    with pytest.raises(RuntimeError, match="injected fault at step 4"):
        hook.maybe_fire(4)
    hook.maybe_fire(5)  # fired once (its marker)


def test_other_ranks_do_not_fire(tmp_path):
    hook = FaultHook.parse(f"step=3,rank=1,mode=raise,marker={tmp_path}/r", rank=0)
    hook.maybe_fire(3)
    assert not (tmp_path / "r").exists()


def _fire_in_child(spec: str, calls: list[tuple[str, int]]) -> None:
    hook = FaultHook.parse(spec, rank=0)
    for kind, step in calls:
        (hook.maybe_fire if kind == "step" else hook.maybe_fire_save)(step)


def _exit_code(spec: str, calls: list[tuple[str, int]]) -> int:
    p = mp.get_context("fork").Process(target=_fire_in_child, args=(spec, calls))
    p.start()
    p.join(30)
    assert not p.is_alive()
    return p.exitcode


def test_save_fault_fires_at_the_first_checkpoint_at_or_after_its_step_and_not_at_steps(tmp_path):
    spec = f"step=5,mode=save,marker={tmp_path}/s"
    assert _exit_code(spec, [("step", 5), ("step", 6), ("save", 4)]) == 0  # steps never fire a save fault
    assert _exit_code(spec, [("save", 4), ("save", 8)]) == 1
    assert json.loads((tmp_path / "s").read_text())["step"] == 8
    assert _exit_code(spec, [("save", 8), ("save", 12)]) == 0  # once per marker


def test_two_close_faults_each_fire_once(tmp_path):
    spec = f"step=4,mode=exit;step=5,mode=exit;markers={tmp_path}"
    assert _exit_code(spec, [("step", 3), ("step", 4)]) == 1  # first life dies at 4
    assert _exit_code(spec, [("step", 4), ("step", 5)]) == 1  # restarted before 4: passes it, dies at 5
    assert _exit_code(spec, [("step", 4), ("step", 5), ("step", 6)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault-0.json", "fault-1.json"]


def test_steps_after_the_last_log_point_count_as_recomputed():
    """The ledger learns each step (not only log points), so a fault between log points charges every step
    done after the restored checkpoint (bench/chaos.py compares it with the sample trace)."""
    from elastic_train.train.goodput import GoodputBook
    from elastic_train.train.state import Goodput

    book = GoodputBook()
    book.begin_attempt(100.0, 2, None, None, [])
    book.first_step_done(101.0)
    book.heartbeat(110.0, 10, productive_s=9.0, checkpoint_s=0.0)  # a log point and a checkpoint at step 10
    saved = Goodput(**vars(book.totals))
    for step in (11, 12, 13):
        book.stepped(step)  # no log point before the fault at step 13
    event = book.begin_attempt(120.0, 2, 10, saved, [2])
    assert event["recomputed_steps"] == 3 and book.totals.recomputed_steps == 3
