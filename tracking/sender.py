"""MLflow logging from a child process, so the training process never competes with it for the GIL.

Building MLflow entities, SQLAlchemy writes (for the embedded sqlite store) and HTTP calls are milliseconds of
Python per batch; run in a background *thread* of the training process they hold the GIL against the training
step (measured: -25 % samples/s with per-step logging on a 2-core machine). :class:`ProcessTracker` instead
writes each call as one JSON line to a child process (``python -m tracking.sender``), which runs an ordinary
:class:`~tracking.mlflow_tracker.MlflowTracker` (batching, retries, spool). Rank 0 of a worker group uses it.
The training process never waits for it: every call is a pipe write, and the child itself skips the steps a
restarted run recomputes (``skip_logged_steps``) once it has asked MLflow for the run's last step.

The child leaves the worker's process tree at start (fork, new session): Ray kills a worker's child processes
when the worker exits, and a trial that ASHA stops, or a worker that loses its node's peer, exits at once —
the tags, params and metrics still queued would die with it. If the training process dies, the child reads
end-of-file and sends what it holds (spooling what it cannot send within 2 minutes). Every sender of a run holds
the run's lock file (tracking/fence.py) from before its first send until it exits, so a restarted run's sender
waits for such an orphan to finish (bounded) before it asks MLflow for the run's last step and logs only the
steps after it: each step appears once, also when the orphan held steps through an MLflow outage.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import asdict
from typing import Any

from tracking.base import ForwardingTracker, TrackingSpec, apply_call
from tracking.quiet import quiet_mlflow_logging


class ProcessTracker(ForwardingTracker):
    """The Tracker interface, forwarded to a child process (see the module docstring)."""

    def __init__(self, spec: TrackingSpec):
        self.spec = spec
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **spec.env)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tracking.sender", json.dumps(asdict(spec))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1,
        )
        self._pid: int | None = None  # the detached sender's (the Popen'd process exits once it has forked)
        self._done = threading.Event()
        self._result: dict[str, Any] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        # Pipe writes can block while the child starts (it imports mlflow): a writer thread absorbs that.
        self._writer = threading.Thread(target=self._write, name="mlflow-pipe", daemon=True)
        self._writer.start()
        threading.Thread(target=self._read, name="mlflow-answers", daemon=True).start()

    def _read(self) -> None:
        """The child's answers, one JSON object a line: its pid, then close's result."""
        for line in self._proc.stdout or ():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "pid" in msg:
                self._pid = msg["pid"]
            else:
                self._result = msg
        self._done.set()  # end of file: the child is gone

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

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Flush within ``timeout_s`` (the child spools the rest); returns its ``{sent, unsent, spool_path}``."""
        self._send("close", timeout_s)
        self._lines.put(None)
        self._writer.join(timeout=timeout_s)
        if not self._done.wait(timeout_s + 30) and self._pid:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._proc.wait()  # the intermediate process, long gone
        return self._result or {"sent": 0, "unsent": -1, "spool_path": None, "error": "the sender did not answer"}


ORPHAN_FLUSH_S = 120.0  # how long a sender nobody waits for keeps trying before it spools (tracking/fence.py)


def _detach() -> None:
    """Leave the worker's process tree: fork, let the parent exit at once, start a new session."""
    if hasattr(os, "fork"):
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    _answer({"pid": os.getpid()})


def _answer(msg: dict[str, Any]) -> None:
    """One line to the training process, which may be gone (a stopped trial): then nobody is listening."""
    try:
        print(json.dumps(msg), flush=True)
    except (BrokenPipeError, ValueError, OSError):
        pass


def _main() -> int:
    _detach()
    # A busy machine gives the training process the CPU first; metrics can wait (a stopped trial's too: this
    # process outlives it). Importing mlflow alone is seconds of CPU, a visible share of a short run. The lowest
    # priority: at nice 10 against a nice-0 worker this process still took ~10 % of a core's slices while it
    # imported, and each slice stalls a step whose intra-op threads fill the cores. It catches up while the
    # worker evaluates and checkpoints, and ``close`` waits for it.
    os.nice(19 - os.nice(0))
    # Our stderr is the worker's, which Ray forwards to the driver's console: MLflow's INFO lines stay off it.
    quiet_mlflow_logging()
    from tracking.fence import SenderFence, lock_path
    from tracking.mlflow_tracker import MlflowTracker

    spec = TrackingSpec(**json.loads(sys.argv[1]))
    tracker = MlflowTracker(spec, fence=SenderFence(lock_path(spec.spool_path, spec.run_id)))
    tracker.connected.wait(60)
    for line in sys.stdin:
        cmd, args = json.loads(line)
        if cmd == "close":
            return _close(tracker, spec, *args)
        apply_call(tracker, cmd, args)
    # End of input without "close": the training process died (a crash, or a trial stopped early). Send what
    # it logged (nobody waits for this process now; the rest is spooled after 2 minutes): a restart skips the
    # steps MLflow holds by the time it asks.
    _answer(tracker.close(timeout_s=ORPHAN_FLUSH_S))
    return 0


def _close(tracker: Any, spec: TrackingSpec, timeout_s: float) -> int:
    """The training process closes: it waits ``timeout_s`` at most. What is still unsent then (MLflow away at
    the end of a run) is not spooled at once: the answer says how much is pending, the training process stops
    waiting (our stdout closes), and this detached process keeps sending as an orphan does, for up to
    :data:`ORPHAN_FLUSH_S`, holding the run's fence (a restart waits for it; ``bench/chaos.py`` does too)."""
    if tracker.flush(timeout_s):
        _answer(tracker.close(0))
        return 0
    pending = tracker.pending()
    _answer({"sent": tracker.sent, "unsent": pending, "spool_path": spec.spool_path, "skipped": tracker.skipped,
             "still_sending": True})
    try:
        sys.stdout.close()
    except OSError:
        pass
    tracker.close(timeout_s=ORPHAN_FLUSH_S)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
