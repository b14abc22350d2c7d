"""MLflow behind the Tracker interface: explicit run ids, a background sender, retries, and a spool.

Calls return at once; a daemon thread batches metrics, params and tags into ``log_batch`` requests. When the
server is unreachable the thread keeps everything and retries with backoff, so training never waits on
MLflow and a server restart loses nothing. ``close()`` flushes within a deadline and writes whatever is
still unsent to a JSONL spool file whose path it returns (``replay_spool`` sends it later).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from tracking.base import TrackingSpec
from tracking.quiet import quiet_mlflow_logging

log = logging.getLogger(__name__)

MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100  # MLflow's log_batch limits
REQUEST_TIMEOUT_S = 10  # MLFLOW_HTTP_REQUEST_TIMEOUT unless set
PARAM_MAX_CHARS = 6000
BATCH_WINDOW_S = 1.0


def yield_cpu_to_training() -> None:
    """Lower this thread's CPU priority (Linux: nice is per thread): logging waits, training does not."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + 10))
    except (AttributeError, OSError):
        pass


def quiet_client_retries() -> None:
    """Make a failed request fail fast: our sender retries; MLflow's own backoff would block it for minutes."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(REQUEST_TIMEOUT_S))


ATTEMPT_TAG = "elastic_train.attempt"


_WAKE = ("wake", None)  # close() puts it in the queue to end the sender thread's wait; never sent or spooled


class MlflowTracker:
    """Logs into one existing run (``spec.run_id``); never creates or ends runs (the driver does)."""

    def __init__(self, spec: TrackingSpec, start_system_metrics: bool | None = None, fence: Any = None):
        """``fence``: a :class:`~tracking.fence.SenderFence` the sender thread takes before it sends anything
        (rank 0's sender child: no other sender of the run may deliver steps after the floor is read)."""
        for k, v in spec.env.items():
            os.environ.setdefault(k, v)
        quiet_client_retries()
        quiet_mlflow_logging()  # also on the Train controller (checkpoint callback) and in the sender child
        self.spec = spec
        # metrics logged unless_logged at steps <= this are dropped (skip_logged_steps); None: not known yet, the
        # sender thread asks the server (after the fence) before it sends any of them
        self._floor: int | None = -1
        self._fence = fence
        # A failed log_batch may still have reached the store (a response lost as the server shut down, a
        # client timeout): its metric-bearing size and first metric, checked before it is sent again
        self._unsure: tuple[int, tuple] | None = None
        self.client: Any = None  # created by the sender thread: importing mlflow takes seconds
        self._system_wanted = start_system_metrics if start_system_metrics is not None else spec.system_metrics
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._pending: deque[tuple[str, Any]] = deque()  # taken from the queue, not yet acknowledged
        self._closed = threading.Event()
        self._idle = threading.Event()
        self._hurry = threading.Event()  # set while someone waits in flush(): no batch window
        self.connected = threading.Event()  # mlflow imported and the client built
        self._lock = threading.Lock()
        self.sent = 0
        self.sent_artifacts = 0
        self.skipped = 0  # recomputed steps the run held already (skip_logged_steps)
        self.refused = 0  # items of a superseded attempt (spec.attempt older than the run's tag): never sent
        self.superseded_by: int | None = None
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="mlflow-sender", daemon=True)
        self._system: Any = None
        self._thread.start()

    # ------------------------------------------------------------------------------ interface
    def log_params(self, params: dict[str, Any]) -> None:
        for k, v in params.items():
            self._queue.put(("param", (str(k), _param_value(v))))

    def skip_logged_steps(self, fallback: int) -> None:
        """The floor is the server's answer, asked by the sender thread once it holds the fence and the server
        answers. Not ``fallback`` (the worker's own record): it lags what reached the server (a step logged
        twice) or leads it (a step queued in a dead process, never logged again)."""
        self._floor = None

    def log_metrics(self, metrics: dict[str, float], step: int, timestamp_ms: int | None = None, *,
                    unless_logged: bool = False) -> None:
        floor = self._floor
        if unless_logged and floor is not None and step <= floor:
            return
        kind = "metric_unless" if unless_logged else "metric"  # the sender thread drops those <= the floor
        ts = timestamp_ms or int(time.time() * 1000)
        for k, v in metrics.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and v == v:  # numbers, not NaN
                self._queue.put((kind, (k, float(v), ts, int(step))))

    def set_tags(self, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self._queue.put(("tag", (str(k), str(v))))

    def log_checkpoint(self, path: str, artifact_path: str) -> None:
        self._queue.put(("artifacts", (str(path), artifact_path)))

    def remove_when_sent(self, path: str) -> None:
        """Remove the folder ``path`` once everything queued before this call is sent (a snapshot made for
        :meth:`log_checkpoint`). Never spooled: what is unsent at close keeps its folder for ``replay_spool``."""
        self._queue.put(("remove", str(path)))

    def log_model(self, model: Any, **kwargs: Any) -> Any:
        """Synchronous: the model is the run's main output and callers wait for its URI."""
        import mlflow.pytorch

        self.flush(timeout_s=60)
        return _with_tracking_uri(
            self.spec.uri, lambda: mlflow.pytorch.log_model(model, run_id=self.spec.run_id, **kwargs)
        )

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far is sent; False when the deadline passed first."""
        deadline = time.monotonic() + timeout_s
        self._hurry.set()  # the sender thread sends at once instead of letting metrics accumulate
        try:
            while time.monotonic() < deadline:
                with self._lock:
                    if not self._queue.unfinished_tasks and not self._pending:  # see _take
                        return True
                self._idle.clear()
                self._idle.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            return False
        finally:
            self._hurry.clear()

    def pending(self) -> int:
        """Items not yet sent (queued or in flight)."""
        with self._lock:
            return len(self._pending) + self._queue.unfinished_tasks

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Flush within ``timeout_s``; spool the rest to JSONL. Returns ``{sent, unsent, spool_path}``."""
        self.flush(timeout_s)
        self._closed.set()
        self._queue.put(_WAKE)  # the sender thread may sit in its 0.2 s queue wait: end it now, not at the timeout
        # A request in flight must end (answered, or timed out) before this process may exit: one the server
        # still processes after our exit (our fence released) would land after a restarted run read its floor.
        self._thread.join(timeout=_request_timeout() + 5)
        self._stop_system_metrics()  # after the join: the sender thread starts the monitor (_connect), if at all
        leftover = list(self._pending)
        while not self._queue.empty():
            leftover.append(self._queue.get_nowait())
        leftover = [item for item in leftover if item is not _WAKE]
        kept = {item[1][0] for item in leftover if item[0] == "artifacts"}  # spooled below: replay needs them
        for path in {item[1] for item in leftover if item[0] == "remove"} - kept:
            shutil.rmtree(path, ignore_errors=True)  # its uploads were sent; the removal had not come yet
        leftover = [item for item in leftover if item[0] != "remove"]
        if self.superseded_by is not None:  # a replaced writer writes nothing: not even a spool to replay later
            self.refused += len(leftover)
            leftover = []
        spool = self._spool(leftover) if leftover else None
        return {"sent": self.sent, "unsent": len(leftover), "spool_path": spool, "skipped": self.skipped,
                "refused": self.refused, "superseded_by": self.superseded_by, "sent_artifacts": self.sent_artifacts,
                "unsent_artifacts": sum(1 for kind, _ in leftover if kind == "artifacts")}

    # ------------------------------------------------------------------------------ sender thread
    def _connect(self) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.spec.uri)
        if self._system_wanted:
            self._start_system_metrics()
        self.connected.set()

    def _run(self) -> None:
        backoff = 0.5
        yield_cpu_to_training()
        if self._fence is not None:  # an orphaned sender of this run sends what it holds first (bounded)
            self._fence.acquire(cancel=self._closed)
        self._connect()
        while not self._closed.is_set():
            with self._lock:
                while len(self._pending) < 5000:
                    try:
                        self._take(self._queue.get_nowait())
                    except queue.Empty:
                        break
            if not self._pending:
                self._idle.set()
                try:
                    item = self._queue.get(timeout=0.2)
                except queue.Empty:
                    continue
                with self._lock:
                    self._take(item)
                if item is _WAKE:
                    continue
                if item[0] in ("metric", "metric_unless"):
                    # Let metrics accumulate into one request: per-step logging then costs one request a second,
                    # not one per step (each is milliseconds of CPU, stolen from training on small machines).
                    # Not while a flush waits: a run's last metrics go at once (its close is teardown).
                    # (close() flushes first, so it cuts the window short too.)
                    self._hurry.wait(BATCH_WINDOW_S)
                continue
            try:
                self._send_some()
                backoff = 0.5
            except Exception as e:  # any failure: keep the data, retry later
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log.warning("MLflow unreachable (%s); %d items buffered, retrying", _short(e), len(self._pending))
                self._closed.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _take(self, item: tuple[str, Any]) -> None:
        """An item taken from the queue goes to the pending ones (under the lock). The queue counts it as
        unfinished until then: a flush that found the queue empty while the item was in this thread's hands,
        taken but not yet pending, returned with it unsent (and a close then spooled it)."""
        if item is not _WAKE:
            self._pending.append(item)
        self._queue.task_done()

    def _send_some(self) -> None:
        """Send one request's worth from the head of the pending queue; drop it only after success."""
        if self.spec.attempt is not None and not self._attempt_is_newest():
            with self._lock:
                self.refused += len(self._pending)
                self._pending.clear()
            return
        head = self._pending[0]
        if head[0] == "remove":  # everything before it is sent
            shutil.rmtree(head[1], ignore_errors=True)
            with self._lock:
                self._pending.popleft()
            return
        if head[0] == "artifacts":
            path, artifact_path = head[1]
            self.client.log_artifacts(self.spec.run_id, path, artifact_path=artifact_path)
            with self._lock:
                self._pending.popleft()
            self.sent += 1
            self.sent_artifacts += 1
            return
        from mlflow.entities import Metric, Param, RunTag

        if self._floor is None and any(kind == "metric_unless" for kind, _ in self._pending):
            from tracking.runs import last_logged_step

            self._floor = last_logged_step(self.spec.uri, self.spec.run_id)  # raises while the server is away
        if self._unsure is not None and self._landed_already():
            return
        metrics, params, tags, n, skipped, first = [], [], [], 0, 0, None
        for kind, item in self._pending:
            if kind == "artifacts":
                break
            if kind == "metric_unless" and self._floor is not None and item[3] <= self._floor:
                skipped += 1  # the run holds this step already (sent before a restart): dropped, not sent twice
            elif kind in ("metric", "metric_unless") and len(metrics) < MAX_METRICS:
                metrics.append(Metric(*item))
                first = first or item
            elif kind == "param" and len(params) < MAX_PARAMS:
                params.append(Param(*item))
            elif kind == "tag" and len(tags) < MAX_TAGS:
                tags.append(RunTag(*item))
            else:
                break
            n += 1
        if metrics or params or tags:
            self._unsure = (n, first) if first else None
            self.client.log_batch(self.spec.run_id, metrics=metrics, params=params, tags=tags, synchronous=True)
            self._unsure = None
        with self._lock:
            for _ in range(n):
                self._pending.popleft()
        self.sent += n - skipped
        self.skipped += skipped

    def _attempt_is_newest(self) -> bool:
        """The fence (elastic_train/train/fence.py), kept in the store itself: the run's ``elastic_train.attempt``
        tag names the newest worker group's attempt. Read before every batch: an older attempt's sender (a worker
        cut off by a partition, talking again after the run restarted without it) sends nothing more. A newer one
        raises the tag before it reads the run's floor, so an old sender stops before the new one's floor could
        miss what it sends. (MLflow has no conditional write: a batch already in flight can still land.)"""
        if self.superseded_by is not None:
            return False
        tag = self.client.get_run(self.spec.run_id).data.tags.get(ATTEMPT_TAG, "")
        newest = int(tag) if tag.isdigit() else 0
        if newest > self.spec.attempt:
            self.superseded_by = newest
            log.warning("attempt %s was superseded by attempt %s: its %d unsent item(s) are refused",
                        self.spec.attempt, newest, len(self._pending))
            return False
        if newest < self.spec.attempt:
            self.client.set_tag(self.spec.run_id, ATTEMPT_TAG, str(self.spec.attempt))
        return True

    def _landed_already(self) -> bool:
        """Whether the last failed batch reached the store after all (its first metric, same timestamp and value,
        is there): then it is dropped as sent, not sent twice. Raises while the server is away."""
        n, (key, value, ts, step) = self._unsure
        landed = any(m.step == step and m.timestamp == ts and m.value == value
                     for m in self.client.get_metric_history(self.spec.run_id, key))
        self._unsure = None
        if landed:
            with self._lock:
                for _ in range(n):
                    self._pending.popleft()
            self.sent += n
        return landed

    # ------------------------------------------------------------------------------ helpers
    def _spool(self, items: list[tuple[str, Any]]) -> str:
        path = Path(self.spec.spool_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for kind, item in items:
                kind = "metric" if kind == "metric_unless" else kind
                f.write(json.dumps({"run_id": self.spec.run_id, "kind": kind, **_as_json(kind, item)}) + "\n")
        log.warning("MLflow: %d items could not be sent; written to %s", len(items), path)
        return str(path)

    def _stop_system_metrics(self) -> None:
        """Stop MLflow's monitor and publish its last window. The monitor samples every
        ``MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL`` (10 s by default) and, stopped between two samples, drops the
        window it was in: a run shorter than one interval logged no ``system/*`` metric at all, and every run lost
        its last seconds. One sample now, the window aggregated and logged through the monitor's own methods."""
        monitor, self._system = self._system, None
        if monitor is None:
            return
        try:
            monitor.finish()
            monitor.collect_metrics()
            monitor.publish_metrics(monitor.aggregate_metrics())
            monitor.mlflow_logger.flush()
        except Exception as e:  # system metrics are best effort: said once, training's metrics are unaffected
            log.warning("MLflow system metrics: the last window was not logged: %s", _short(e))

    def _start_system_metrics(self) -> None:
        try:
            import inspect

            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            where: dict[str, Any] = {"tracking_uri": self.spec.uri}
            if "tracking_uri" not in inspect.signature(SystemMetricsMonitor).parameters:  # MLflow before 3.x's
                os.environ["MLFLOW_TRACKING_URI"] = self.spec.uri  # monitor logs to the process's URI (ours alone)
                where = {}
            self._system = SystemMetricsMonitor(self.spec.run_id, resume_logging=True, **where)
            self._system.start()
        except Exception as e:  # missing psutil/pynvml must not stop training
            log.warning("MLflow system metrics unavailable: %s", _short(e))
            self._system = None


def replay_spool(path: str | Path, uri: str) -> int:
    """Send a spool file's entries to ``uri`` (e.g. once the server is back); returns how many were sent."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client, sent = MlflowClient(tracking_uri=uri), 0
    for line in Path(path).read_text().splitlines():
        e = json.loads(line)
        if e["kind"] == "metric":
            client.log_batch(e["run_id"], metrics=[Metric(e["key"], e["value"], e["timestamp"], e["step"])])
        elif e["kind"] == "param":
            client.log_batch(e["run_id"], params=[Param(e["key"], e["value"])])
        elif e["kind"] == "tag":
            client.log_batch(e["run_id"], tags=[RunTag(e["key"], e["value"])])
        elif e["kind"] == "artifacts":
            client.log_artifacts(e["run_id"], e["path"], artifact_path=e["artifact_path"])
        sent += 1
    return sent


def _as_json(kind: str, item: Any) -> dict[str, Any]:
    if kind in ("metric", "metric_unless"):
        return dict(zip(("key", "value", "timestamp", "step"), item, strict=True))
    if kind in ("param", "tag"):
        return {"key": item[0], "value": item[1]}
    return {"path": item[0], "artifact_path": item[1]}


def _param_value(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= PARAM_MAX_CHARS else s[: PARAM_MAX_CHARS - 3] + "..."


def _request_timeout() -> float:
    try:
        return float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", REQUEST_TIMEOUT_S))
    except ValueError:
        return REQUEST_TIMEOUT_S


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def _with_tracking_uri(uri: str, fn: Any) -> Any:
    """Call ``fn`` with MLflow's global tracking URI set to ``uri``, then restore it *and* the env var.

    ``mlflow.set_tracking_uri`` also exports MLFLOW_TRACKING_URI; restoring with set_tracking_uri(get()) would
    leave the old default exported and redirect the next run. MLflow's own context manager restores both.
    """
    from elastic_train.compat.mlflow import use_tracking_uri

    with use_tracking_uri(uri):
        return fn()
