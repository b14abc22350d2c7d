"""MLflow logging from a child process, so the training process never competes with it for the GIL.

Building MLflow entities, SQLAlchemy writes (for the embedded sqlite store) and HTTP calls are milliseconds of
Python per batch; run in a background *thread* of the training process they hold the GIL against the training
step (measured: -25 % samples/s with per-step logging on a 2-core machine). :class:`ProcessTracker` instead
writes each call as one JSON line to a child process (``python -m tracking.sender``), which runs an ordinary
:class:`~tracking.mlflow_tracker.MlflowTracker` (batching, retries, spool). Rank 0 of a worker group uses it.

If the training process dies, the child reads end-of-file: it drops the unsent metrics (the restarted run
recomputes those steps and logs them after the last step MLflow holds) and sends the rest within 10 s.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import Any

from tracking.base import TrackingSpec


class ProcessTracker:
    """The Tracker interface, forwarded to a child process (see the module docstring)."""

    def __init__(self, spec: TrackingSpec):
        self.spec = spec
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **spec.env)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tracking.sender", json.dumps(asdict(spec))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1,
        )
        self._ready = threading.Event()
        self._last_step: int | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        # Pipe writes can block while the child starts (it imports mlflow): a writer thread absorbs that.
        self._writer = threading.Thread(target=self._write, name="mlflow-pipe", daemon=True)
        self._writer.start()
        threading.Thread(target=self._await_ready, name="mlflow-ready", daemon=True).start()

    def _await_ready(self) -> None:
        line = self._proc.stdout.readline() if self._proc.stdout else ""
        try:
            self._last_step = json.loads(line).get("last_step")
        except (json.JSONDecodeError, AttributeError):
            self._last_step = None
        self._ready.set()

    def _send(self, cmd: str, *args: Any) -> None:
        self._lines.put(json.dumps([cmd, args], default=str))

    def _write(self) -> None:
        stdin = self._proc.stdin
        while (line := self._lines.get()) is not None:
            try:
                stdin.write(line + "\n")
            except (BrokenPipeError, ValueError):
                return
        try:
            stdin.close()
        except BrokenPipeError:
            pass

    def ready(self, timeout_s: float = 60.0) -> int | None:
        """Wait up to ``timeout_s`` for the child to connect (0: just ask).

        Returns the highest ``train_loss`` step the run already holds (-1: none), or None while the child is
        still starting or when MLflow could not say.
        """
        self._ready.wait(timeout_s)
        return self._last_step if self._ready.is_set() else None

    @property
    def answered(self) -> bool:
        return self._ready.is_set()

    def log_params(self, params: dict[str, Any]) -> None:
        self._send("log_params", params)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        self._send("log_metrics", numbers, int(step), int(time.time() * 1000))

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._send("set_tags", {k: str(v) for k, v in tags.items()})

    def log_checkpoint(self, path: str, artifact_path: str) -> None:
        self._send("log_checkpoint", str(path), artifact_path)

    def log_model(self, model: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the final model is logged by the driver")

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Flush within ``timeout_s`` (the child spools the rest); returns its ``{sent, unsent, spool_path}``."""
        self._send("close", timeout_s)
        self._lines.put(None)
        self._writer.join(timeout=timeout_s)
        try:
            self._proc.wait(timeout=timeout_s + 30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        out = self._proc.stdout.read() if self._proc.stdout else ""
        for line in reversed((out or "").splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        return {"sent": 0, "unsent": -1, "spool_path": None, "error": f"sender exited with {self._proc.returncode}"}


def _main() -> int:
    os.nice(10)  # a busy machine gives the training process the CPU first; metrics can wait a moment
    from tracking.mlflow_tracker import MlflowTracker
    from tracking.runs import last_logged_step

    spec = TrackingSpec(**json.loads(sys.argv[1]))
    tracker = MlflowTracker(spec)
    tracker.connected.wait(60)
    try:
        last: int | None = last_logged_step(spec.uri, spec.run_id)
    except Exception:  # noqa: BLE001 - the server is away: the parent falls back to its own record
        last = None
    print(json.dumps({"ready": True, "last_step": last}), flush=True)
    for line in sys.stdin:
        cmd, args = json.loads(line)
        if cmd == "close":
            print(json.dumps(tracker.close(*args)), flush=True)
            return 0
        if cmd == "log_metrics":
            metrics, step, ts = args
            tracker.log_metrics(metrics, step, timestamp_ms=ts)
        else:
            getattr(tracker, cmd)(*args)
    # End of input without "close": the training process died. Its unsent metrics are dropped: the restarted
    # run recomputes those steps and logs them after the last step MLflow holds. Tags and params are kept.
    tracker.discard_metrics()
    print(json.dumps(tracker.close(timeout_s=10)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
