"""This rank's checkpoint uploads: at most one in flight, and how far training ran ahead of durable storage.

Ray Train uploads each reported checkpoint on one background thread per worker (``checkpoint_upload_mode=ASYNC``),
in order, and queues the others without a bound. On object storage one upload can take longer than the interval
between two checkpoints; the queue then grew for the whole run. Seen on the hosts harness (S3, 150 epochs of
digits): every step trained 26 s into the job while the bucket held checkpoints up to step 308 of 1,650; the
end of the run waited 64 s for the queue (teardown); a host lost during that wait cost 1,342 steps.

**The choice: the next checkpoint waits.** Before a checkpoint is reported, :meth:`Uploads.before_report` waits
until this rank's previous upload is durable (on storage, ``meta.json`` last). So at most one upload is in
flight, and:

* a failure loses at most one interval plus one upload: the newest durable checkpoint is the previous one or the
  one before it, never older (a restart resumes from the newest complete one: train/worker.py);
* the end of a run waits for one upload, the final checkpoint's, whatever the number of checkpoints;
* what the wait costs is charged to the checkpoint that waited (goodput ``checkpoint_s``), and the auto interval
  (train/interval.py) counts each checkpoint's time until it is durable, so it does not ask for checkpoints faster
  than storage takes them.

Rejected: the newest checkpoint superseding a queued one. Every rank would have to drop the same one (a
checkpoint is every rank's part), so the ranks would have to agree at a sync point on what each one's
upload thread has done; and Ray Train's thread reports in order, so a dropped report still passes through it.
Waiting needs no agreement: each rank waits for its own previous upload, then all meet in the report.

:attr:`Uploads.worst_behind_steps` / ``_s`` record the run at its worst: how many steps (and seconds) training was
ahead of its newest durable checkpoint, sampled just before each checkpoint becomes durable, when it is furthest.
No Ray here: train/worker.py calls :meth:`before_report` before ``ray.train.report`` and :meth:`finished` from
the upload function Ray Train runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

WAIT_BOUND_S = 1800.0  # an upload is bounded by the storage's own retries (data/filesystems.py); this is a backstop
SAY_EVERY_S = 60.0


class UploadTimeout(RuntimeError):
    pass


@dataclass
class Durability:
    """What :class:`Uploads` measured since it was last asked (:meth:`Uploads.take`)."""

    upload_s: float = 0.0  # hand-off to durable, summed over the uploads that finished
    uploads: int = 0
    worst_behind_s: float = 0.0  # the worst so far (not reset by take)
    worst_behind_steps: int = 0


class Uploads:
    """One rank's uploads. ``step_now`` reads the training loop's global step (set by the session)."""

    def __init__(self, say: Callable[[str], None] | None = None, wait_bound_s: float = WAIT_BOUND_S):
        self.say = say or (lambda _line: None)
        self.wait_bound_s = wait_bound_s
        self.step_now: Callable[[], int] = lambda: 0
        self._cond = threading.Condition()
        self._in_flight: dict[str, tuple[int, float]] = {}  # name -> (step, handed off at)
        self._durable = (0, time.time())  # the newest durable checkpoint: (step, when its state was taken)
        self._new = Durability()

    def start(self, step_now: Callable[[], int], restored_step: int) -> None:
        """The attempt's loop starts from ``restored_step`` (durable: it was restored from storage)."""
        with self._cond:
            self.step_now, self._durable = step_now, (restored_step, time.time())

    def before_report(self, name: str, step: int) -> float:
        """Wait until this rank's previous upload is durable (bounded), then note ``name`` as in flight. Returns
        the seconds waited (the caller's checkpoint blocked that long)."""
        t0 = time.monotonic()
        with self._cond:
            said = False
            while self._in_flight:
                waited = time.monotonic() - t0
                if waited >= self.wait_bound_s:
                    raise UploadTimeout(f"checkpoint {name}: the upload of {', '.join(self._in_flight)} did not "
                                        f"finish within {self.wait_bound_s:g} s; is the storage reachable?")
                if waited >= SAY_EVERY_S and not said:
                    said = True
                    self.say(f"checkpoint {name} waits for the upload of {', '.join(self._in_flight)} ({waited:.0f} "
                             "s so far): the storage takes checkpoints slower than the interval asks for them")
                self._cond.wait(min(SAY_EVERY_S, self.wait_bound_s - waited))
            self._in_flight[name] = (step, time.time())
        return time.monotonic() - t0

    def finished(self, name: str, ok: bool) -> None:
        """Ray Train's upload thread: ``name`` is on storage (``ok``) or its upload failed (the attempt fails)."""
        now = time.time()
        with self._cond:
            step, handed_off = self._in_flight.pop(name, (None, now))
            if ok and step is not None:
                self._note_behind(now)
                self._durable = (step, handed_off)
                self._new.upload_s += now - handed_off
                self._new.uploads += 1
            self._cond.notify_all()

    def _note_behind(self, now: float) -> None:
        """How far training is ahead of the newest durable checkpoint right now (just before a newer one lands)."""
        steps = max(0, self.step_now() - self._durable[0])
        self._new.worst_behind_steps = max(self._new.worst_behind_steps, steps)
        self._new.worst_behind_s = max(self._new.worst_behind_s, now - self._durable[1])

    def drain(self) -> float:
        """Wait (bounded) until nothing is in flight: the end of a run, so that the last upload is measured.
        Returns the seconds waited."""
        waited = self.before_report("(end of the run)", 0)
        with self._cond:
            self._in_flight.pop("(end of the run)", None)
        return waited

    def take(self) -> Durability:
        """What was measured since the last call (the worst values are the run's so far)."""
        with self._cond:
            out, self._new = self._new, Durability(worst_behind_s=self._new.worst_behind_s,
                                                   worst_behind_steps=self._new.worst_behind_steps)
            return out
