"""Rank 0's progress lines and tqdm_ray bar; silent on the other ranks (so the loop has no rank branches).

The bar is Ray's ``tqdm_ray`` (it survives the worker's stdout being forwarded to the driver), imported only
when bars are on: apart from it, nothing here touches Ray.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class Console:
    """Progress lines and a tqdm_ray bar on rank 0; silent elsewhere (no rank branches in the loop)."""

    def __init__(self, enabled: bool, bars: bool):
        self.enabled, self.bars = enabled, bars
        self.bar: Any | None = None
        self.last_line = 0.0

    def line(self, text: str) -> None:
        # sys.stdout.write, not print: Ray Train patches print() to also log, which doubles every line.
        if self.enabled:
            sys.stdout.write(f"[elastic-train] {text}\n")
            sys.stdout.flush()

    def epoch_bar(self, epoch: int, epochs: int, total: int, start: int) -> None:
        if not (self.enabled and self.bars):
            return
        from ray.experimental.tqdm_ray import tqdm

        self.close()
        self.bar = tqdm(total=total, desc=f"epoch {epoch + 1}/{epochs}", position=0)
        if start:
            self.bar.update(start)

    def progress(self, steps: int, desc: str) -> None:
        """Advance the bar; without bars (logs, CI), print a line at most every 10 s."""
        if self.bar is not None:
            self.bar.set_description(desc)
            self.bar.update(steps)
        elif time.monotonic() - self.last_line >= 10.0:
            self.last_line = time.monotonic()
            self.line(desc)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
