"""The sample-id trace (``data.trace_path``): one JSON line per step per rank, appended across restarts.

It is how tests and the fault campaign prove exactly-once per epoch (tests/helpers/trace.py reads it). Each
line carries the rank, world size, pid and the worker group's ``attempt`` (train/fence.py), and no line is
written once ``may_write()`` says this attempt was superseded: a worker cut off by a partition writes nothing
for steps the run has moved past.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any


class Trace:
    """``<path>.rank<r>``, opened for appending (None path: every call is a no-op)."""

    def __init__(self, path: str | None, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self.attempt: int | None = None
        self.may_write: Callable[[], bool] = lambda: True
        self._file = open(f"{path}.rank{rank}", "a") if path else None  # closed in close()

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def fence(self, attempt: int, may_write: Callable[[], bool]) -> None:
        """Stamp lines with ``attempt`` and write none once ``may_write()`` is False."""
        self.attempt, self.may_write = attempt, may_write

    def step(self, epoch: int, step: int, ids: list[int], **extra: Any) -> None:
        self._write({"epoch": epoch, "step": step, "rank": self.rank, "world_size": self.world_size,
                     "t": time.time(), **extra, "ids": ids})

    def mark(self, event: dict[str, Any]) -> None:
        """A non-step line (e.g. where a PBT clone took over its donor's position)."""
        self._write({"event": event, "rank": self.rank, "t": time.time()})

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None or not self.may_write():
            return
        record.update(pid=os.getpid(), attempt=self.attempt)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
