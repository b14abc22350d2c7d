"""Test-only fault injection: ``$ELASTIC_TRAIN_FAULT`` makes workers die, raise or dawdle at chosen steps.

Used by the recovery tests, the fault campaign (``bench/chaos.py``) and the failure rehearsal in docs/faults.md.
The driver parses the spec once (:meth:`FaultPlan.parse`: a malformed one is a ConfigError, exit 2) and hands
the string to every worker. No Ray, no MLflow.

Syntax: faults separated by ``;``, each a comma-separated ``key=value`` list::

    step=7,rank=1,mode=exit,marker=/tmp/f1 ; step=9,mode=raise ; step=12,mode=save ; delay=0.1 ; markers=/tmp/run1
    delay=0.25,delay_until=/shared/fast

* ``step=K`` (required for a fault): the global optimizer step it fires at (``mode=save``: the first checkpoint
  at step >= K).
* ``rank=R`` (default 0): the worker that fails. A rank the current world size lacks never fires.
* ``mode``: ``exit`` (default; ``os._exit(1)``, as a lost process), ``raise`` (a RuntimeError out of the
  training function), ``save`` (``os._exit(1)`` during a checkpoint save: this rank's part is written, nothing
  is reported, so the run resumes from the checkpoint before).
* ``marker=PATH``: fire once per marker file (it is created when the fault fires, with a JSON record: step,
  rank, mode, unix time, pid). ``markers=DIR`` (anywhere) gives every fault without one ``DIR/fault-<i>.json``.
  Without a marker a fault fires every time its step is reached (a restart from before it fires it again).
* ``when=spares-warm``: at step K, wait until this worker's node has a warm spare process for each of its
  training workers (train/spares.py; at most 120 s), then fire after one more step (so that the wait is not
  counted as recovery): a fault in a run's steady state, whatever the machine's speed (the recovery benchmark
  and test measure a restart onto spares).
* ``delay=SECONDS`` (anywhere): every rank pauses this long after each step, to stretch a short run.
  ``delay_until=PATH``: only until PATH exists (a test that has seen what it waited for lets the run finish at
  full speed; every rank's step checks once, a restarted worker too).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from elastic_train.errors import ConfigError
from elastic_train.files import write_json_atomically

FAULT_ENV = "ELASTIC_TRAIN_FAULT"
MODES = ("exit", "raise", "save")
_FAULT_KEYS = {"step", "rank", "mode", "marker", "when"}
WHEN = ("spares-warm",)
WHEN_BOUND_S = 120.0
_GLOBAL_KEYS = {"delay", "delay_until", "markers"}


@dataclass(frozen=True)
class Fault:
    """One scheduled fault."""

    step: int
    rank: int = 0
    mode: str = "exit"
    marker: str | None = None
    when: str | None = None  # spares-warm: wait (bounded) for the node's warm spares

    def fired(self) -> bool:
        return bool(self.marker) and os.path.exists(self.marker)

    def record(self, global_step: int) -> None:
        """Create the marker (atomically, so a reader never sees half a record)."""
        if not self.marker:
            return
        path = Path(self.marker)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomically(path, {"step": global_step, "scheduled_step": self.step, "rank": self.rank,
                                     "mode": self.mode, "unix": time.time(), "pid": os.getpid()}, indent=None)


@dataclass(frozen=True)
class FaultPlan:
    """Every fault of a spec, and the per-step delay."""

    faults: tuple[Fault, ...] = ()
    delay: float = 0.0
    markers: str | None = None  # also where workers note their restart phases (FaultHook.note)
    delay_until: str | None = None  # the delay ends once this path exists

    @classmethod
    def parse(cls, spec: str | None) -> FaultPlan:
        """Parse ``spec`` (see the module docstring); ConfigError naming ``ELASTIC_TRAIN_FAULT`` when malformed."""
        if not spec or not spec.strip():
            return cls()
        entries = [_entry(spec, part) for part in spec.split(";") if part.strip()]
        merged: dict[str, str] = {}
        for entry in entries:
            merged.update({k: v for k, v in entry.items() if k in _GLOBAL_KEYS})
        delay = _number(spec, "delay", merged.get("delay", "0"), float)
        if delay < 0:
            raise ConfigError(FAULT_ENV, spec, f"delay={merged['delay']}: must be >= 0")
        faults = []
        for i, entry in enumerate(e for e in entries if _FAULT_KEYS & e.keys()):
            faults.append(_fault(spec, entry, i, merged.get("markers")))
        return cls(tuple(faults), delay, merged.get("markers"), merged.get("delay_until"))

    def for_rank(self, rank: int) -> FaultPlan:
        return FaultPlan(tuple(f for f in self.faults if f.rank == rank), self.delay, self.markers,
                         self.delay_until)


def _entry(spec: str, part: str) -> dict[str, str]:
    entry: dict[str, str] = {}
    for kv in part.split(","):
        kv = kv.strip()
        if not kv:
            continue
        key, sep, value = kv.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ConfigError(FAULT_ENV, spec, f"{kv!r}: write key=value (keys: step, rank, mode, marker, when, "
                                               "markers, delay, delay_until; faults separated by ';')")
        if key not in _FAULT_KEYS | _GLOBAL_KEYS:
            raise ConfigError(FAULT_ENV, spec, f"unknown key {key!r} (keys: step, rank, mode, marker, when, "
                                               "markers, delay, delay_until)")
        entry[key] = value
    return entry


def _fault(spec: str, entry: dict[str, str], index: int, markers: str | None) -> Fault:
    if "step" not in entry:
        raise ConfigError(FAULT_ENV, spec, f"fault {index + 1} has no step=K")
    step = _number(spec, "step", entry["step"], int)
    rank = _number(spec, "rank", entry.get("rank", "0"), int)
    if step < 1 or rank < 0:
        raise ConfigError(FAULT_ENV, spec, f"fault {index + 1}: step must be >= 1 and rank >= 0")
    mode = entry.get("mode", "exit")
    if mode not in MODES:
        raise ConfigError(FAULT_ENV, spec, f"mode={mode}: one of {', '.join(MODES)}")
    marker = entry.get("marker") or (str(Path(markers) / f"fault-{index}.json") if markers else None)
    when = entry.get("when")
    if when is not None and when not in WHEN:
        raise ConfigError(FAULT_ENV, spec, f"when={when}: one of {', '.join(WHEN)}")
    return Fault(step, rank, mode, marker, when)


def _spares_warm() -> bool:
    """This node has a warm spare for each of its training workers (train/spares.py)."""
    from elastic_train.train.spares import this_node, warm

    idle, busy = this_node()
    return bool(busy) and len(warm(idle)) >= len(busy)


def _number(spec: str, key: str, value: str, kind: type) -> int | float:
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(FAULT_ENV, spec, f"{key}={value}: not a{'n integer' if kind is int else ' number'}") \
            from None


def append_marker(markers: str, name: str, event: str, **fields: object) -> None:
    """Append ``{"event", "unix", **fields}`` as one JSON line to ``markers/name`` (the restart timelines that
    bench/chaos.py and bench/recovery.py read: the workers' phases, the Train controller's events)."""
    os.makedirs(markers, exist_ok=True)
    with open(Path(markers) / name, "a") as f:
        f.write(json.dumps({"event": event, "unix": time.time(), **fields}) + "\n")


class FaultHook:
    """One rank's faults, checked after every optimizer step (:meth:`maybe_fire`) and inside every checkpoint
    save (:meth:`maybe_fire_save`)."""

    def __init__(self, plan: FaultPlan | None = None, rank: int = 0):
        self.plan = plan or FaultPlan()
        self.delay = self.plan.delay
        self.rank = rank
        self._armed: set[Fault] = set()  # when=spares-warm faults whose wait is over: fire at the next step

    @classmethod
    def from_env(cls, rank: int, spec: str | None = None, environ: Mapping[str, str] = os.environ) -> FaultHook:
        """``rank``'s hook from ``spec`` (the driver's ``$ELASTIC_TRAIN_FAULT``, passed down in WorkerArgs) or,
        when the driver passed none, from this worker's own environment."""
        return cls.parse(spec or environ.get(FAULT_ENV), rank)

    @classmethod
    def parse(cls, spec: str | None, rank: int) -> FaultHook:
        return cls(FaultPlan.parse(spec).for_rank(rank), rank)

    def note(self, event: str, **fields: float | int | str | None) -> None:
        """With ``markers=DIR``: append this worker's restart phase ``event`` (``entered``, ``built``, ``restored``,
        ``first_step``) with its unix time to ``DIR/phases.rank<R>.jsonl``, for bench/chaos.py and
        bench/recovery.py. A no-op otherwise."""
        if self.plan.markers:
            append_marker(self.plan.markers, f"phases.rank{self.rank}.jsonl", event, pid=os.getpid(),
                          rank=self.rank, **fields)

    def maybe_fire(self, global_step: int) -> None:
        if self.delay:
            if self.plan.delay_until and os.path.exists(self.plan.delay_until):
                self.delay = 0.0  # for good: the path is not removed while the run lasts
            else:
                time.sleep(self.delay)
        for fault in self.plan.faults:
            if fault.mode == "save" or fault.fired():
                continue
            if fault in self._armed:
                self._fire(fault, global_step)
            elif fault.step == global_step:
                if fault.when != "spares-warm":
                    self._fire(fault, global_step)
                deadline = time.monotonic() + WHEN_BOUND_S
                while not _spares_warm() and time.monotonic() < deadline:
                    time.sleep(0.2)  # the run pauses here until the node's spares are warm
                self._armed.add(fault)  # and fires after one more step: the pause is not part of the recovery

    def maybe_fire_save(self, global_step: int) -> None:
        """Called between writing this rank's checkpoint part and reporting it."""
        for fault in self.plan.faults:
            if fault.mode == "save" and global_step >= fault.step and not fault.fired():
                self._fire(fault, global_step)

    @staticmethod
    def _fire(fault: Fault, global_step: int) -> None:
        fault.record(global_step)
        if fault.mode == "raise":
            raise RuntimeError(f"injected fault at step {global_step}")
        os._exit(1)
