"""The driver's timeline: when the job was launched and where its wall time went before and after training.

Goodput counts the whole wall (DESIGN invariant 9): from the moment the job was launched to the moment it ended.
When a job is the program (``python -m jobs.train``, ``elastic-train train``: ``main`` reads the command line),
its launch is the *process* start, read from ``/proc/self/stat``, so interpreter start and imports count. A job
called in-process (``jobs.train.main([...])`` from a notebook or a test) starts its clock at that call.

The driver marks the end of each phase (``mark("ray start")``); a phase runs from the previous mark (or the
launch) to its own, so the phases tile the wall with no gap and no overlap and none can be negative. There is
one timeline per driver process (:func:`begin` replaces it); without one, :func:`mark` does nothing, so library
callers (a sweep trial's ``fit``) need not care.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from elastic_train.train.process_info import process_start_unix

__all__ = ["Timeline", "begin", "current", "mark", "process_start_unix"]


@dataclass
class Timeline:
    """Phase ends since ``launched`` (unix seconds). ``phases()`` tiles the wall from the launch to the last mark."""

    launched: float
    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, name: str, at: float | None = None) -> None:
        """The phase ``name`` ended ``at`` (now); it started at the previous mark. Never before that mark."""
        at = time.time() if at is None else at
        self.marks.append((name, max(at, self.last)))

    @property
    def last(self) -> float:
        return self.marks[-1][1] if self.marks else self.launched

    def at(self, name: str) -> float | None:
        """When the phase ``name`` ended (its last mark), or None."""
        return next((t for n, t in reversed(self.marks) if n == name), None)

    def phases(self, since: str | None = None, until: str | None = None) -> list[tuple[str, float]]:
        """``(name, seconds)`` per phase, in order; only those after the mark ``since`` and up to ``until``."""
        out, prev, on = [], self.launched, since is None
        for name, t in self.marks:
            if on:
                out.append((name, t - prev))
            prev = t
            if name == since:
                on = True
            if name == until:
                break
        return out


_current: Timeline | None = None


def begin(from_process_start: bool) -> Timeline:
    """Start this driver's timeline: at the process start (the job is the program) or now (called in-process)."""
    global _current
    now = time.time()
    start = process_start_unix() if from_process_start else None
    _current = Timeline(start if start is not None else now)
    if start is not None:
        _current.mark("interpreter + imports", now)
    return _current


def current() -> Timeline | None:
    return _current


def mark(name: str) -> None:
    """Mark the end of phase ``name`` on this driver's timeline (nothing when there is none)."""
    if _current is not None:
        _current.mark(name)
