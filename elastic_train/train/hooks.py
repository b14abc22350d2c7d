"""What one worker does beside training, at the step loop's named moments: goodput, test faults, phase markers.

The session (session.py) calls one method per moment and knows nothing of what each does::

    built · restored · attempt_begun · loop_started · stepped · window_logged · checkpoint_written · checkpointed

The accounting those moments feed is pure arithmetic on the :class:`~elastic_train.train.goodput.GoodputBook`
(each method takes its clock reading as an argument, so a unit test drives it without a worker); here it is only
given the time and pushed to the run's ledger. Test faults (train/faults.py) fire at ``stepped`` and at
``checkpoint_written``; with ``markers=DIR`` the restart phases are noted for the recovery benchmarks. A node's
warm spares (train/spares.py) are kept from an attempt's first step on.
A new thing to do at one of these moments is one method body here. No Ray, no MLflow.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from elastic_train.train.faults import FaultHook
from elastic_train.train.goodput import GoodputBook, GoodputReporter
from elastic_train.train.state import Goodput


class LoopHooks:
    """One rank's goodput reporter and fault hook, called by the session at the loop's named moments.
    ``keep_spares``: starts the keeper of its node's spare processes (returns at once), or None."""

    def __init__(self, goodput: GoodputReporter, fault: FaultHook, device: torch.device,
                 keep_spares: Callable[[], None] | None = None):
        self.goodput, self.fault, self.device = goodput, fault, device
        self.keep_spares = keep_spares or (lambda: None)

    @property
    def book(self) -> GoodputBook:
        return self.goodput.book

    # ------------------------------------------------------------------------------ before the loop
    def built(self) -> None:
        self.fault.note("built")

    def restored(self, global_step: int) -> None:
        self.fault.note("restored", step=global_step)

    def attempt_begun(self, world_size: int, restored_step: int | None, restored: Goodput | None,
                      restored_sizes: list[int]) -> dict[str, Any]:
        """This worker group (re)started: the book is read back and charged (the restart, the steps to
        recompute, a resize). Returns what to announce."""
        return self.goodput.begin_attempt(world_size, restored_step, restored, restored_sizes)

    def announced(self) -> None:
        self.goodput.push(force=True)

    # ------------------------------------------------------------------------------ the loop
    def loop_started(self) -> None:
        """Startup (or the restart) ends: steps count as productive from here."""
        self.book.loop_started(time.time())

    def stepped(self, global_step: int, first: bool) -> None:
        """An optimizer step is done (``first``: this attempt's first)."""
        if first:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.book.first_step_done(time.time())
            self.fault.note("first_step", step=global_step)
            self.keep_spares()  # after the first step: a recovery is timed to it
        self.book.stepped(global_step)
        self.goodput.push()  # at most every 0.25 s: the ledger knows the last step when a worker dies
        self.fault.maybe_fire(global_step)

    def window_logged(self, global_step: int, wall_s: float) -> None:
        """A metrics window was reduced and logged: its wall time was productive."""
        self.book.heartbeat(time.time(), global_step, wall_s, 0.0)
        self.goodput.push()

    def metrics_logged(self, global_step: int) -> None:
        """Tracking holds this step's metrics: a restarted group logs only after it."""
        self.book.tracking_floor = max(self.book.tracking_floor, global_step)

    # ------------------------------------------------------------------------------ checkpoints
    def checkpoint_written(self, global_step: int) -> None:
        """This rank's part is on local disk, not yet reported (a ``mode=save`` fault fires here)."""
        self.fault.maybe_fire_save(global_step)

    def checkpointed(self, global_step: int, block_s: float, eval_s: float, finalize_s: float) -> None:
        """A checkpoint is reported; ``block_s`` is all it blocked training for, of which ``eval_s`` was
        validation and ``finalize_s`` the run's final summary (teardown)."""
        self.book.checkpointed(time.time(), global_step, block_s, eval_s, finalize_s)

    def uploads_measured(self, upload_s: float, uploads: int, behind_steps: int, behind_s: float) -> None:
        """Uploads that became durable since the last call, and the worst lag behind storage so far."""
        self.book.uploads_measured(upload_s, uploads, behind_steps, behind_s)

    def flush(self) -> None:
        self.goodput.push(force=True)

    def close(self) -> None:
        """The attempt ends (finished or failing): the ledger gets the last book before the process may go."""
        self.goodput.close()
