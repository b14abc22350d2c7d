"""Goodput accounting across failures: pure Python, driven by rank 0, persisted in a RunLedger.

Rank 0 keeps a :class:`GoodputBook`; after each log interval it pushes the book to the run's ledger (kept in
the GCS, which outlives worker groups: train/ledger.py). When a worker group restarts, the new rank 0 reads the
last book back and charges the failure: the time from the last heartbeat before it to the first step after it,
and the steps (and their time) done after the restored checkpoint, which must now be recomputed.

The book's totals are the run's, cumulative over job resumes (they travel in every checkpoint).
:func:`wall_parts` turns one driver's book into named parts of *that driver's* wall, from its launch to its
end, which add up to it (DESIGN invariant 9): startup (launch to the first training loop), productive steps,
checkpoint saves, validation, restart/recompute lost, teardown (after training's last sign of life, and the
run summary inside the final checkpoint: the tracking flush and final hashes), and what falls between them
(``other_s``: the metric work just before a checkpoint, a few milliseconds each).

:class:`GoodputReporter` is the book together with its ledger; the ledger is any object with ``put``, ``flush``
and ``get`` (train/ledger.py's RunLedger), so nothing here imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from elastic_train.train.state import Goodput


@dataclass
class GoodputBook:
    totals: Goodput = field(default_factory=Goodput)
    world_sizes: list[int] = field(default_factory=list)
    attempts: int = 0
    last_step: int = 0  # global step at the last heartbeat
    last_time: float = 0.0  # wall time (unix) of the last heartbeat
    # Not accounting: the tracker's fallback dedupe floor (the highest step whose metrics were handed to tracking),
    # kept here because the book is what outlives a worker group (the ledger); a restarted group's tracker
    # uses it only when the tracking store cannot say what it holds (tracking/base.py skip_logged_steps)
    tracking_floor: int = -1
    first_step_unix: float | None = None
    pending_failure_since: float | None = None  # set at a restart until its training loop starts
    attempt_started: float = 0.0
    launched: float | None = None  # unix time the driver was launched (its wall and startup count from here)
    loop_started_unix: float | None = None  # the first training loop's start in this driver
    driver_base: Goodput | None = None  # totals as this driver found them (a resumed job carries earlier ones)
    finalize_s: float = 0.0  # this driver's run summary inside the final checkpoint (tracking flush): teardown

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GoodputBook:
        d = dict(d)
        d["totals"] = Goodput(**d["totals"])
        if d.get("driver_base") is not None:
            d["driver_base"] = Goodput(**d["driver_base"])
        return cls(**d)

    # --------------------------------------------------------------------------------- events
    def begin_attempt(
        self,
        now: float,
        world_size: int,
        restored_step: int | None,
        restored: Goodput | None,
        restored_sizes: list[int],
    ) -> dict[str, Any]:
        """A worker group (re)started. Returns what to announce: restart number, lost steps, resize."""
        first_in_driver = self.attempts == 0
        self.attempts += 1
        self.attempt_started = now
        event: dict[str, Any] = {"restart": False, "recomputed_steps": 0, "previous_world_size": None}
        if first_in_driver:
            if restored is not None:  # a resumed job: carry the run's history from the checkpoint
                self.totals = Goodput(**asdict(restored))
                self.totals.restarts += 1
                self.world_sizes = list(restored_sizes)
                self.last_step = restored_step or 0
                event["restart"] = True
        else:
            self.totals.restarts += 1
            event["restart"] = True
            lost_steps = max(0, self.last_step - (restored_step or 0))
            self.totals.recomputed_steps += lost_steps
            event["recomputed_steps"] = lost_steps
            if restored is not None:  # productive time after the checkpoint is lost with those steps
                wasted = max(0.0, self.totals.productive_s - restored.productive_s)
                self.totals.productive_s -= wasted
                self.totals.restart_lost_s += wasted
            self.pending_failure_since = self.last_time or now
        if first_in_driver:
            self.driver_base = Goodput(**asdict(self.totals))
        if self.world_sizes and self.world_sizes[-1] != world_size:
            event["previous_world_size"] = self.world_sizes[-1]
        if not self.world_sizes or self.world_sizes[-1] != world_size:
            self.world_sizes.append(world_size)
        event["restarts"] = self.totals.restarts
        return event

    def loop_started(self, now: float) -> None:
        """The training loop starts (its steps count as productive from here): startup or a restart ends."""
        if self.loop_started_unix is None:
            self.loop_started_unix = now
            self.totals.startup_s += max(0.0, now - (self.launched or self.attempt_started))
        if self.pending_failure_since is not None:
            self.totals.restart_lost_s += max(0.0, now - self.pending_failure_since)
            self.pending_failure_since = None
        self.last_time = now

    def stepped(self, global_step: int) -> None:
        """An optimizer step finished: a failure from here on loses the steps since the restored checkpoint."""
        self.last_step = global_step

    def first_step_done(self, now: float) -> None:
        if self.first_step_unix is None:
            self.first_step_unix = now

    def heartbeat(
        self, now: float, global_step: int, productive_s: float, checkpoint_s: float, eval_s: float = 0.0
    ) -> None:
        self.totals.productive_s += productive_s
        self.totals.checkpoint_s += checkpoint_s
        self.totals.eval_s += eval_s
        self.last_step, self.last_time = global_step, now

    def checkpointed(self, now: float, global_step: int, block_s: float, eval_s: float, finalize_s: float) -> None:
        """A checkpoint that blocked training ``block_s``: its validation (``eval_s``) is validation, the run's
        final summary inside it (``finalize_s``: tracking flush, final hashes) is teardown, the rest is the
        checkpoint's cost."""
        self.finalize_s += finalize_s
        saving = max(0.0, block_s - finalize_s - eval_s)
        self.heartbeat(now, global_step, 0.0, saving, eval_s)
        self.totals.checkpoints += 1

    def uploads_measured(self, upload_s: float, uploads: int, behind_steps: int, behind_s: float) -> None:
        """Checkpoint uploads that became durable (train/uploads.py), and the worst lag behind storage seen."""
        t = self.totals
        t.upload_s += upload_s
        t.uploads += uploads
        t.behind_max_steps = max(t.behind_max_steps, behind_steps)
        t.behind_max_s = max(t.behind_max_s, behind_s)


WALL_PARTS = ("startup_s", "productive_s", "checkpoint_s", "eval_s", "restart_lost_s", "teardown_s", "other_s")


def wall_parts(launched: float, ended: float, book: dict[str, Any] | None, fit_ended: float | None = None
               ) -> dict[str, float]:
    """One driver's wall (``launched`` to ``ended``) in named parts that add up to it, and the goodput ratio.

    ``book`` is the driver's final goodput book (None when nothing trained: an already-complete resume, a
    failure before any worker started); ``fit_ended`` is when training returned (teardown starts there when
    no loop ran). Counts are this driver's only, whatever the run did before a resume. No part is negative:
    ``other_s`` (the time between the named parts) is clamped at zero, so the sum matches the wall to within
    clock noise.
    """
    wall = max(0.0, ended - launched)
    parts = dict.fromkeys(WALL_PARTS, 0.0)
    b = GoodputBook.from_dict(book) if book else None
    if b is None or b.loop_started_unix is None:
        fit_end = min(max(fit_ended if fit_ended is not None else ended, launched), ended)
        parts["startup_s"], parts["teardown_s"] = fit_end - launched, ended - fit_end
    else:
        base = b.driver_base or Goodput()
        for key in ("productive_s", "checkpoint_s", "eval_s", "restart_lost_s"):
            parts[key] = max(0.0, getattr(b.totals, key) - getattr(base, key))
        loop_start = min(max(b.loop_started_unix, launched), ended)
        parts["startup_s"] = loop_start - launched
        last = min(max(b.last_time, loop_start), ended)
        parts["teardown_s"] = ended - last + min(b.finalize_s, last - loop_start)
    parts["other_s"] = max(0.0, wall - sum(parts.values()))
    out: dict[str, float] = {"wall_s": wall, **parts}
    out["goodput_ratio"] = parts["productive_s"] / wall if wall > 0 else 0.0
    return out


class Ledger(Protocol):
    """Where the book outlives a worker group (train/ledger.py: the GCS's key-value store)."""

    def put(self, book: dict[str, Any]) -> None: ...  # fire and forget

    def flush(self, timeout_s: float = ...) -> bool: ...  # wait, bounded, until what was put is sent

    def get(self) -> dict[str, Any] | None: ...


class GoodputReporter:
    """Rank 0's book and its copy in the ledger; with no ledger (other ranks, no ledger) the book stays local."""

    PUSH_EVERY_S = 0.25

    def __init__(self, ledger: Ledger | None, say: Callable[[str], None], launched: float | None = None):
        self.ledger, self.say, self.launched = ledger, say, launched
        self.book = GoodputBook(launched=launched)
        self._pushed = float("-inf")

    def begin_attempt(
        self, world_size: int, restored_step: int | None, restored: Goodput | None, restored_sizes: list[int]
    ) -> dict[str, Any]:
        """Read the run's book back (a new one when there is none) and open this attempt in it."""
        previous = self._fetch()
        self.book = GoodputBook.from_dict(previous) if previous else GoodputBook(launched=self.launched)
        return self.book.begin_attempt(time.time(), world_size, restored_step, restored, restored_sizes)

    def push(self, force: bool = False) -> None:
        """Save the book to the ledger (fire and forget), at most every 0.25 s unless forced."""
        if self.ledger is None:
            return
        now = time.monotonic()
        if force or now - self._pushed >= self.PUSH_EVERY_S:
            self._pushed = now
            self.ledger.put(self.book.to_dict())

    def close(self) -> None:
        """The attempt ends: the book as it stands, sent before the process may go (bounded)."""
        if self.ledger is None:
            return
        self.push(force=True)
        if not self.ledger.flush():
            self.say("goodput ledger: the last book was not sent (the GCS did not take it in time); the run's summary "
                     "may miss its end")

    def _fetch(self) -> dict[str, Any] | None:
        """The run's last book; accounting must never stop training, so errors are None."""
        if self.ledger is None:
            return None
        try:
            return self.ledger.get()
        except Exception as e:
            self.say(f"goodput ledger unavailable ({type(e).__name__}); accounting restarts")
            return None
