"""Test-only fault injection: ``$ELASTIC_TRAIN_FAULT`` makes a worker die or dawdle at a chosen step.

Used by the recovery tests and the README's failure rehearsal. No Ray, no MLflow.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

FAULT_ENV = "ELASTIC_TRAIN_FAULT"  # e.g. "step=7,rank=1,marker=/tmp/f,mode=exit" (see FaultHook)


class FaultHook:
    """Test-only hooks from ``$ELASTIC_TRAIN_FAULT`` (comma-separated ``key=value``):

    * ``step=K,rank=R,marker=PATH,mode=exit|raise`` -- at global step K, rank R dies once per marker file:
      ``exit`` kills the process outright (as a lost node would), ``raise`` throws from the training function.
    * ``delay=SECONDS`` -- every rank pauses this long after each step, to stretch a short run while a test
      removes and adds nodes.
    """

    def __init__(self, step: int | None = None, marker: str | None = None, mode: str = "exit", delay: float = 0.0):
        self.step, self.marker, self.mode, self.delay = step, marker, mode, delay

    @classmethod
    def from_env(cls, rank: int, spec: str | None = None, environ: Mapping[str, str] = os.environ) -> FaultHook:
        """``rank``'s hook from ``spec`` (the driver's ``$ELASTIC_TRAIN_FAULT``, passed down in WorkerArgs) or,
        when the driver passed none, from this worker's own environment."""
        return cls.parse(spec or environ.get(FAULT_ENV), rank)

    @classmethod
    def parse(cls, spec: str | None, rank: int) -> FaultHook:
        if not spec:
            return cls()
        parts = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
        delay = float(parts.get("delay", 0.0))
        if "step" not in parts or int(parts.get("rank", 0)) != rank:
            return cls(delay=delay)
        return cls(int(parts["step"]), parts.get("marker"), parts.get("mode", "exit"), delay)

    def maybe_fire(self, global_step: int) -> None:
        if self.delay:
            time.sleep(self.delay)
        if self.step is None or global_step != self.step:
            return
        if self.marker:
            if os.path.exists(self.marker):
                return
            Path(self.marker).write_text(str(global_step))
        if self.mode == "raise":
            raise RuntimeError(f"injected fault at step {global_step}")
        os._exit(1)
