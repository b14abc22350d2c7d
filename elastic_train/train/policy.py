"""When to checkpoint: step, time and epoch cadence, and the preemption decision.

Only *sync points* can checkpoint: steps where every rank all-reduces rank 0's flags (``train.sync_every_steps``,
and every log point: log cadence, step checkpoints, epoch ends; there the metrics window travels in the same
all-reduce), so every rank takes the same decision on the same step.
Time is read on rank 0 only and travels in those flags. Preemption is asked at most every
``PREEMPTION_CHECK_S``: the worker passes in ``ray.train.get_preemption_info`` (a barrier every rank reaches
on the same step), so nothing here imports Ray.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic-free at run time
    from elastic_train.config import JobConfig
    from elastic_train.train.budget import Budget
    from elastic_train.train.state import Progress

PREEMPTION_CHECK_S = 2.0


class CheckpointPolicy:
    """Sync points and checkpoint reasons for one attempt; its clocks (re)start with the loop
    (:meth:`start_clocks`)."""

    def __init__(self, cfg: JobConfig, preemption_info: Callable[[], Any] | None, say: Callable[[str], None],
                 budget: Budget | None = None):
        self.cfg, self.preemption_info, self.say, self.budget = cfg, preemption_info, say, budget
        self.last_checkpoint = time.monotonic()
        self.last_preemption_check = time.monotonic()
        self.preemption_saved = False
        self._flags_time = 0.0
        # the cadence in force: the config's, until checkpoint.every_steps=auto chooses (train/interval.py)
        every = cfg.checkpoint.every_steps
        self.every_steps: int | None = every if isinstance(every, int) else None
        self.every_seconds: float | None = cfg.checkpoint.every_seconds

        self.proposed = 0  # rank 0's new auto interval, applied on every rank at the next sync point

    def start_clocks(self) -> None:
        """The loop starts: time-based checkpoints and preemption checks count from now."""
        self.last_checkpoint = self.last_preemption_check = time.monotonic()

    def propose(self, every_steps: int) -> None:
        """Rank 0's ``every_steps=auto`` choice: it travels in the next sync point's flags, and every rank
        applies it there (ranks that disagreed on sync points would deadlock in the all-reduce)."""
        self.proposed = every_steps if every_steps != self.every_steps else 0

    def set_interval(self, every_steps: int) -> None:
        """Checkpoint every ``every_steps`` steps, and no longer on the clock (an auto choice replaces both)."""
        self.every_steps, self.every_seconds = every_steps, None

    def is_log_point(self, global_step: int, step_in_epoch: int) -> bool:
        """Steps whose metrics window every rank all-reduces and rank 0 logs: the log cadence, epoch ends, step
        checkpoints and the budget's last step (a checkpoint always follows a logged window)."""
        every = self.every_steps
        return (
            global_step % self.cfg.tracking.log_every_steps == 0
            or step_in_epoch == 0
            or bool(every and global_step % every == 0)
            or bool(self.budget and self.budget.by != "epochs" and global_step >= self.budget.total_steps)
        )

    def is_sync_point(self, global_step: int, step_in_epoch: int) -> bool:
        """Steps where every rank takes rank 0's flags (time checkpoints, preemption, an auto interval): the sync
        cadence (``train.sync_every_steps``) and every log point."""
        return global_step % self.cfg.train.sync_every_steps == 0 or self.is_log_point(global_step, step_in_epoch)

    def flags(self) -> dict[str, bool | float]:
        """Rank 0's time-based decisions and its proposed interval, to be reduced (broadcast) with the metrics
        window."""
        now = self._flags_time = time.monotonic()
        every = self.every_seconds
        return {
            "time_checkpoint": bool(every and now - self.last_checkpoint >= every),
            # no barrier at all where nothing watches for preemption (an embedded Ray: launch/trainer.py)
            "check_preemption": (self.preemption_info is not None
                                 and now - self.last_preemption_check >= PREEMPTION_CHECK_S),
            "every_steps": float(self.proposed),
        }

    def synced(self, flags: dict[str, Any]) -> None:
        """The reduced flags are every rank's: a preemption check they ask for counts from when they were read;
        a proposed interval holds from here, on every rank."""
        if flags["check_preemption"]:
            self.last_preemption_check = self._flags_time
        if flags.get("every_steps", 0) > 0:
            self.set_interval(int(round(flags["every_steps"])))
            self.proposed = 0

    def reason(self, flags: dict[str, bool], progress: Progress, epoch_end: bool) -> str | None:
        """Why to checkpoint now (``final``, ``epoch end``, ``every N steps``, ``every T s``, ``preemption``)."""
        cfg, p = self.cfg, progress
        reason = None
        if self.budget is not None and self.budget.by != "epochs":  # a step/token budget ends mid-epoch
            final = p.global_step >= self.budget.total_steps
        else:
            final = p.epoch >= cfg.train.epochs and epoch_end
        if final:
            reason = "final"
        elif epoch_end and cfg.checkpoint.at_epoch_end:
            reason = "epoch end"
        elif self.every_steps and p.global_step % self.every_steps == 0:
            reason = f"every {self.every_steps} steps"
        elif flags["time_checkpoint"] and self.every_seconds:
            reason = f"every {self.every_seconds:g} s"
        if flags["check_preemption"] and not self.preemption_saved and self._preempted():
            reason = "preemption"  # a checkpoint due anyway now doubles as the just-in-time one
        return reason

    def checkpointed(self) -> None:
        self.last_checkpoint = time.monotonic()

    def _preempted(self) -> bool:
        if self.preemption_info is None:
            return False
        info = self.preemption_info()  # a barrier: every rank reaches it on the same step
        if info is None:
            return False
        self.preemption_saved = True
        left = (info.deadline_ms / 1000 - time.time()) if info.deadline_ms else float("nan")
        self.say(f"preemption of node(s) {info.preempted_node_ids}; {left:.0f} s left: saving now")
        return True
