"""One MLflow sender for a whole sweep: rank 0 of every trial logs through it instead of a child process of its own.

In ``jobs.train`` rank 0 starts a sender child (tracking/sender.py) that imports MLflow and opens the store:
~2 s of CPU, once per run. A sweep pays it once per *trial*, on the same cores the trial's workers start on,
and the trial's last checkpoint waits for that child to catch up before its run can end (measured on 2 cores:
1.4-2.6 s of every digits trial's final checkpoint). The sweep's driver instead starts one :class:`TrackingRelay`
actor (MLflow imported once, while the first trial starts) and hands it to every trial; each trial's rank 0
gets a :class:`RelayTracker`, whose calls are fire-and-forget actor calls (a worker never waits for MLflow)
and whose ``close`` is a flush of an already-warm sender.

The relay keeps one :class:`~tracking.mlflow_tracker.MlflowTracker` (batching, retries, spool) per run. It is an
asyncio actor: calls from one worker run in the order they were made, and one run's ``close`` (up to its
deadline, in an MLflow outage) does not hold up the other trials' calls. A restarted worker group of a trial
finds the same run's tracker, which asks MLflow for the run's last step after sending what it holds: the
one-sender-per-run guarantee of tracking/fence.py holds by construction. Trials with system metrics keep their
own sender child (the metrics are the worker node's).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import asdict
from typing import Any

import ray

from tracking.base import ForwardingTracker, TrackingSpec, apply_call


@ray.remote(num_cpus=0, max_restarts=0)
class TrackingRelay:
    def __init__(self) -> None:
        from tracking.quiet import quiet_mlflow_logging

        quiet_mlflow_logging()
        self._trackers: dict[str, Any] = {}
        threading.Thread(target=_import_mlflow, name="import-mlflow", daemon=True).start()  # as trials start

    def _tracker(self, spec: dict[str, Any]) -> Any:
        from tracking.mlflow_tracker import MlflowTracker

        run_id = spec["run_id"]
        if run_id not in self._trackers:
            self._trackers[run_id] = MlflowTracker(TrackingSpec(**spec), start_system_metrics=False)
        return self._trackers[run_id]

    async def call(self, spec: dict[str, Any], cmd: str, args: list[Any]) -> None:
        apply_call(self._tracker(spec), cmd, args)

    async def close(self, spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Flush the run within ``timeout_s`` and spool the rest; the run's next life gets a fresh tracker."""
        tracker = self._tracker(spec)
        self._trackers.pop(spec["run_id"], None)
        return await asyncio.get_event_loop().run_in_executor(None, tracker.close, timeout_s)


    async def close_all(self, timeout_s: float) -> int:
        """The sweep ends: send what the runs still open hold (trials stopped mid-run, their workers gone), as
        an orphaned sender child would. Returns the items left unsent (spooled to each run's spool file)."""
        trackers, self._trackers = list(self._trackers.values()), {}
        loop = asyncio.get_event_loop()
        results = await asyncio.gather(*(loop.run_in_executor(None, t.close, timeout_s) for t in trackers))
        return sum(r.get("unsent", 0) for r in results)


def stop_relay(relay: Any, timeout_s: float = 60.0) -> None:
    """Flush every run the relay still holds (bounded), then end it."""
    try:
        ray.get(relay.close_all.remote(timeout_s), timeout=timeout_s + 30)
    except Exception:  # it is going away either way; the runs' statuses are set by the driver
        pass
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

    def _send(self, cmd: str, *args: Any) -> None:
        self.relay.call.remote(self._spec, cmd, list(args))  # fire and forget; ordered per caller

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        try:
            return ray.get(self.relay.close.remote(self._spec, timeout_s), timeout=timeout_s + 30)
        except Exception as e:  # the relay is gone: what it held is lost with it (said here)
            return {"sent": 0, "unsent": -1, "spool_path": None, "error": f"the relay did not answer: {e}"}
