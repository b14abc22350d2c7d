"""One MLflow sender for a whole sweep: rank 0 of every trial logs through it instead of a child process of its own.

In ``jobs.train`` rank 0 starts a sender child (tracking/sender.py) that imports MLflow and opens the store:
~2 s of CPU, once per run. A sweep pays it once per *trial*, on the same cores the trial's workers start on,
and the trial's last checkpoint waits for that child to catch up before its run can end (measured on 2 cores:
1.4-2.6 s of every digits trial's final checkpoint). The sweep's driver instead starts one :class:`TrackingRelay`
actor (MLflow imported once, while the first trial starts) and hands it to every trial; each trial's rank 0
gets a :class:`RelayTracker`, whose calls are fire-and-forget actor calls (a worker never waits for MLflow)
and whose ``close`` is a flush of an already-warm sender.

The relay keeps one :class:`~tracking.mlflow_tracker.MlflowTracker` (batching, retries, spool) per run. It is an
asyncio actor, so that one run's ``close`` (up to its deadline, in an MLflow outage) does not hold up the other
trials' calls; Ray runs an async actor's calls in no guaranteed order, so each RelayTracker numbers its calls and
the relay applies them in that order (a ``close`` waits for the calls made before it). The sweep's end
(:func:`stop_relay`) waits for the closes still flushing: a trial that Tune stops as its last close runs is
often the sweep's last, and the relay used to be killed under it (its run then lacked every metric). A
restarted worker group of a trial finds the same run's tracker, which asks MLflow for the run's last step after
sending what it holds: the one-sender-per-run guarantee of tracking/fence.py holds by construction. Trials with
system metrics keep their own sender child (the metrics are the worker node's).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import asdict
from typing import Any

import ray

from tracking.base import ForwardingTracker, TrackingSpec, apply_call
from tracking.sender import ORPHAN_FLUSH_S

log = logging.getLogger(__name__)

CALLS_WAIT_S = 10.0  # how long a close waits for calls its caller made before it (in flight: milliseconds)


@ray.remote(num_cpus=0, max_restarts=0)
class TrackingRelay:
    def __init__(self) -> None:
        from tracking.quiet import quiet_mlflow_logging

        quiet_mlflow_logging()
        self._trackers: dict[str, Any] = {}
        # Runs whose close ran past its caller's deadline: still sending, in the background, as an orphaned
        # sender child does (tracking/sender.py), for up to ORPHAN_FLUSH_S; the run's next tracker waits for it.
        self._closing: dict[str, threading.Thread] = {}
        # Each RelayTracker's calls, applied in the order it made them (see :meth:`call`)
        self._streams: dict[str, _Stream] = {}
        self._closes: set[asyncio.Task] = set()  # closes in progress: the sweep's end waits for them
        threading.Thread(target=_import_mlflow, name="import-mlflow", daemon=True).start()  # as trials start

    def _tracker(self, spec: dict[str, Any]) -> Any:
        from tracking.mlflow_tracker import MlflowTracker

        run_id = spec["run_id"]
        if run_id not in self._trackers:
            # One sender per run at a time (tracking/fence.py): a restarted worker group's tracker sends nothing,
            # and reads the run's floor only after the last group's tracker has finished sending.
            previous = _After(self._closing.get(run_id))
            self._trackers[run_id] = MlflowTracker(TrackingSpec(**spec), start_system_metrics=False, fence=previous)
        return self._trackers[run_id]

    async def call(self, spec: dict[str, Any], cmd: str, args: list[Any], stream: str, seq: int) -> None:
        """One Tracker call of ``stream`` (a RelayTracker), numbered ``seq`` by its caller. Ray does not run an
        async actor's calls in the order they were made, not even one caller's (its docs, "Actor Task Execution
        Order"; seen here: a trial's ``set_tags`` ran before its earlier ``skip_logged_steps``): a call that
        overtook an earlier one waits here for it, and each stream's calls are applied in its own order."""
        s = self._stream(stream)
        async with s.changed:
            s.held[seq] = (spec, cmd, args)
            self._apply(s)
            s.changed.notify_all()

    def _stream(self, stream: str) -> _Stream:
        if stream not in self._streams:
            self._streams[stream] = _Stream()
        return self._streams[stream]

    def _apply(self, s: _Stream, gaps_too: bool = False) -> None:
        """Apply ``s``'s held calls that are next in its order; ``gaps_too``: all of them, in order, past a call
        that never came (its caller died before sending it)."""
        while s.held:
            seq = s.next if s.next in s.held else (min(s.held) if gaps_too else None)
            if seq is None:
                return
            spec, cmd, args = s.held.pop(seq)
            s.next = seq + 1
            apply_call(self._tracker(spec), cmd, args)

    async def close(self, spec: dict[str, Any], timeout_s: float, stream: str, calls: int) -> dict[str, Any]:
        """Flush the run within ``timeout_s``, once the ``calls`` its caller made before closing are applied
        (they may arrive after this close: waited for up to :data:`CALLS_WAIT_S` more). What is still unsent
        then (MLflow slow or away as the run ends, a worker's own short close bound) is not spooled at once: it
        goes on being sent in the background for up to :data:`ORPHAN_FLUSH_S` (then spooled), as an orphaned
        sender child would. The run's next life gets a fresh tracker, which waits for that. The close outlives
        its caller (a trial stopped while its last close runs): :meth:`close_all` waits for it."""
        task = asyncio.ensure_future(self._close(spec, timeout_s, stream, calls))
        self._closes.add(task)
        task.add_done_callback(self._closes.discard)
        return await asyncio.shield(task)

    async def _close(self, spec: dict[str, Any], timeout_s: float, stream: str, calls: int) -> dict[str, Any]:
        s = self._stream(stream)
        async with s.changed:
            try:
                await asyncio.wait_for(s.changed.wait_for(lambda: s.next >= calls), CALLS_WAIT_S)
            except TimeoutError:  # a call its caller made never came: the rest, in order
                self._apply(s, gaps_too=True)
        self._streams.pop(stream, None)
        tracker = self._tracker(spec)
        run_id = spec["run_id"]
        self._trackers.pop(run_id, None)
        loop = asyncio.get_running_loop()
        if await loop.run_in_executor(None, tracker.flush, timeout_s):
            return await loop.run_in_executor(None, tracker.close, 0)
        unsent = tracker.pending()
        self._closing[run_id] = _close_in_background(tracker, ORPHAN_FLUSH_S)
        return {"sent": tracker.sent, "unsent": unsent, "spool_path": spec["spool_path"], "still_sending": True,
                "skipped": tracker.skipped}

    async def calls_received(self, stream: str) -> int:
        """How many of ``stream``'s calls have reached the relay (applied or held), until its close."""
        s = self._streams.get(stream)
        return 0 if s is None else s.next + len(s.held)

    async def closes_in_progress(self) -> int:
        """How many closes are running (each waits for its caller's calls, then flushes): what :meth:`close_all`
        will wait for."""
        return len(self._closes)

    async def close_all(self, timeout_s: float) -> list[dict[str, Any]]:
        """The sweep ends: let the closes in progress finish (a trial's last close can still be flushing when
        Tune has stopped it and the sweep ends), send what the runs still open hold (trials stopped mid-run,
        their workers gone), as an orphaned sender child would, and let the background closes finish. Returns
        each run's ``{run_id, unsent, spool_path}`` (what is unsent is in the spool file)."""
        if self._closes:  # each waits for its own caller's calls, then flushes (bounded)
            await asyncio.wait(set(self._closes), timeout=CALLS_WAIT_S + timeout_s)
        for s in self._streams.values():  # calls of dead callers: in their order, past the ones that never came
            self._apply(s, gaps_too=True)
        self._streams.clear()
        trackers, self._trackers = dict(self._trackers), {}
        loop = asyncio.get_running_loop()
        closes = [loop.run_in_executor(None, _closed, run_id, t, timeout_s) for run_id, t in trackers.items()]
        results = list(await asyncio.gather(*closes))
        for thread in self._closing.values():  # bounded by their own ORPHAN_FLUSH_S
            await loop.run_in_executor(None, thread.join, timeout_s)
        results += [thread.result for thread in self._closing.values() if hasattr(thread, "result")]
        return results


class _Stream:
    """One RelayTracker's calls: the next number to apply, and the calls that overtook it."""

    def __init__(self) -> None:
        self.next = 0
        self.held: dict[int, tuple[dict[str, Any], str, list[Any]]] = {}
        self.changed = asyncio.Condition()


class _After:
    """A fence for :class:`~tracking.mlflow_tracker.MlflowTracker`: wait (bounded) until the run's previous
    tracker, still sending in the background, has finished."""

    def __init__(self, previous: threading.Thread | None):
        self.previous = previous

    def acquire(self, timeout_s: float = 0.0, cancel: threading.Event | None = None) -> bool:
        if self.previous is None:
            return True
        deadline = time.monotonic() + ORPHAN_FLUSH_S + 30
        while self.previous.is_alive() and time.monotonic() < deadline and not (cancel and cancel.is_set()):
            self.previous.join(0.2)
        return not self.previous.is_alive()


def _closed(run_id: str, tracker: Any, timeout_s: float) -> dict[str, Any]:
    r = tracker.close(timeout_s)
    return {"run_id": run_id, "unsent": r.get("unsent", 0), "spool_path": r.get("spool_path")}


def _close_in_background(tracker: Any, timeout_s: float) -> threading.Thread:
    def close() -> None:
        thread.result = _closed(tracker.spec.run_id, tracker, timeout_s)  # type: ignore[attr-defined]

    thread = threading.Thread(target=close, name="mlflow-close", daemon=True)
    thread.start()
    return thread


def stop_relay(relay: Any, timeout_s: float = ORPHAN_FLUSH_S) -> None:
    """Flush every run the relay still holds (bounded), then end it. What could not be sent is in each run's spool
    file, which a warning names (``tracking.mlflow_tracker.replay_spool`` sends it later)."""
    try:
        results = ray.get(relay.close_all.remote(timeout_s), timeout=CALLS_WAIT_S + 3 * timeout_s + 30)
    except Exception as e:  # it is going away either way; the runs' statuses are set by the driver
        log.warning("the sweep's MLflow relay did not finish sending (%s): what it held may be lost", e)
        results = []
    for r in results:
        if r["unsent"]:
            log.warning("MLflow run %s: %d item(s) unsent, spooled to %s", r["run_id"], r["unsent"], r["spool_path"])
    ray.kill(relay)


def _import_mlflow() -> None:
    from mlflow.tracking import MlflowClient  # noqa: F401


def start_relay(env: dict[str, str]) -> Any:
    """The sweep's relay, pinned to the driver's node (like the Train controllers it outlives worker nodes).
    ``env``: the tracking credentials (TrackingSpec.env), which a cluster's actors do not inherit from the driver."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    options: dict[str, Any] = {"scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)}
    if env:
        options["runtime_env"] = {"env_vars": dict(env)}
    return TrackingRelay.options(**options).remote()


class RelayTracker(ForwardingTracker):
    """The Tracker interface for rank 0 of a sweep trial, forwarded to the sweep's :class:`TrackingRelay`."""

    def __init__(self, spec: TrackingSpec, relay: Any):
        self.spec, self.relay = spec, relay
        self._spec = {**asdict(spec), "env": {}}  # the relay was started with the credentials (start_relay)
        self._stream, self._calls = uuid.uuid4().hex, 0  # the relay applies our calls in this numbering

    def _send(self, cmd: str, *args: Any) -> None:
        self.relay.call.remote(self._spec, cmd, list(args), self._stream, self._calls)  # fire and forget
        self._calls += 1

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        try:
            return ray.get(self.relay.close.remote(self._spec, timeout_s, self._stream, self._calls),
                           timeout=CALLS_WAIT_S + timeout_s + 30)
        except Exception as e:  # the relay is gone: what it held is lost with it (said here)
            return {"sent": 0, "unsent": -1, "spool_path": None, "error": f"the relay did not answer: {e}"}
