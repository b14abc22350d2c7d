"""Keep Ray's known-benign lines off the driver's console; warnings and errors that signal a problem still print.

**Public first.** Ray's driver drops every forwarded worker line and raylet push that matches
``RAY_DEDUP_LOGS_SKIP_REGEX`` (its log deduplicator, on by default; read once when ``ray`` is imported, off with
``RAY_DEDUP_LOGS=0``). :func:`export_skip_regex` exports :data:`SKIP_REGEX` (the known-benign single lines below,
and those a lost host makes the head push) before a job imports Ray; a regex of the user's own is kept beside
ours. Ray Train's own chatter (its INFO per report, the controller's warnings as it shuts down a failed worker
group) is held back by its public ``LoggingConfig`` (launch/trainer.py); Ray's driver-side loggers by
``ray.init(logging_level=...)``. What a regex cannot do is turn a multi-line block into one line: with the
internal feature ``console_blocks`` (compat/features.py, on by default) :func:`filter_forwarded_lines` wraps
Ray's printers of forwarded output, and the blocks below become one line each; without it they print whole.

Two lines a healthy run would otherwise show:

* ``Token authentication is enabled for this Ray cluster...``: a WARNING that ``ray.init`` logs on the driver
  whenever it starts a local cluster with the default auth mode (the cluster *is* secured: nothing to act on).
  A :class:`logging.Filter` on the one logger that emits it drops that message only; "Token authentication is
  *disabled*" still prints.
* ``core_worker.cc: Actor with class name: 'PreemptionWatcher' ... has constructor arguments in the object
  store and max_restarts > 0 ... ray/issues/53727``: a C++ ``E`` line from the Train controller, which creates
  that actor itself (harmless: the controller holds the arguments for the run's lifetime). The line stays in
  the controller's log file under the session's ``logs/``; only the copy Ray forwards to the driver's console
  is dropped. Ray has no public per-line filter for forwarded output (``RAY_DEDUP_LOGS_SKIP_REGEX`` is read
  once at ``import ray`` and is off with ``RAY_DEDUP_LOGS=0``), so :func:`filter_forwarded_lines` wraps the
  driver's print handler in Ray's private stdstream dispatcher; if a Ray upgrade moves it, nothing is wrapped
  and the line is printed again (no error).
* Ray Data's ``Progress bars disabled...`` and ``Dataset ... execution finished in N seconds`` from the
  SplitCoordinator actors of a streamed run (``data.ray_mode=stream``): one per epoch and per validation pass.
* ``Failed to send resource request for train-...`` and its ``GetTimeoutError`` traceback: a WARNING from the
  Train controller when its 5 s call to Ray's autoscaling coordinator times out, which happens when the CPUs are
  saturated (Ray's own message: "safe to ignore" then). Only that exact block (the message, its traceback, ending
  in ``ray.exceptions.GetTimeoutError``) is dropped from the console; any other failure of that call prints, and
  the block stays in the controller's log file.
* Ray Train's ``PlacementGroupCleaner`` (a detached actor per Train run): its ``Detected that the Ray Train
  controller actor (...) is dead. Cleaning up placement group`` WARNING, which is it doing its job after a sweep
  stopped or paused a trial; and, with a second Ray instance on the machine, the traceback of its monitor thread
  (``Exception in thread PlacementGroupCleanerMonitor:`` ... ``ConnectionError: Found multiple active Ray
  instances``): it queries the state API without an address. The controller stops it when the run ends; a
  sweep's reaper (:mod:`elastic_train.sweep.placement_groups`) removes what a stopped trial left.
* The Train controller's ~25-line traceback as it shuts down a worker group after one of its workers died
  (``Graceful shutdown of backend failed. This is expected if one of the workers has crashed.`` ... ending in
  ``ActorDiedError`` and the exit detail) becomes one line: which worker died, where, and Ray's exit detail; when
  it ends in ``ActorUnavailableError`` (the worker's host gone or cut off), one line that says so. The
  worker's own ``restart N: resumed from ...`` line follows. The whole block stays in the controller's log file.
* The raylet's ``WARNING: N PYTHON worker processes have been started on node: ... which is Nx the maximum
  expected startup concurrency``, which every raylet pushes to every driver of the cluster when many processes
  start at once on a small node (a streamed run's Ray Data tasks, a restarting worker group): nothing for the
  run to act on, and the raylet's log keeps it. Ray's driver prints those pushes itself, not through the
  dispatcher, so :func:`filter_forwarded_lines` wraps that printer too (compat.ray_core).
* The raylet's push when a worker process dies unexpectedly (``A worker died or was killed while executing a task
  by an unexpected system error. ...``: ~1500 characters of ids, the exit detail and a paragraph of advice about
  OOM and resource isolation) becomes one line: the pid, the host, the exit type and detail, and the worker's
  log files on that node.
* A raylet's C++ FATAL: its line stays (it says why), its ~20-line stack trace becomes one line pointing at that
  node's raylet.out, and the head's ``Raylet is terminated ...`` push keeps Ray's message but not the log tail it
  quotes. A host cut off longer than the head's health check allows (docs/clusters.md) is declared dead; when its
  link comes back its raylet learns it and exits with such a FATAL, reaching the console twice (the raylet's
  own output and the head's push): each becomes one line saying what happened and what brings the host back.
* A worker of a group that was already replaced (its host was cut off, the run restarted without it) fails
  when its link returns, with ``Error in training function`` and the traceback of gloo's ``Connection reset by
  peer`` / ``Connection closed by peer``: one line, naming the worker and gloo's reason.
* The GCS's Redis gone (GCS fault tolerance): ~200 forwarded ``redis_context.cc`` errors in the GCS's last seconds
  go (the skip regex; the pieces of requests whose binary arguments broke lines, with ``console_blocks``); the
  driver's own watch (launch/gcs_store.py) says what happened and what follows in one line.
* A process's C++ crash dump (``*** SIGABRT received ...``, its frames twice, Python's ``Fatal Python error`` and
  thread stacks): a crash keeps the check that failed and one line naming the signal; a process Ray ended with
  SIGTERM, and Ray Train's PreemptionWatcher (which Ray Train kills at every worker group's end), print nothing.
  The worker's ``.err`` file keeps the whole dump.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

from elastic_train.compat import features
from elastic_train.compat.ray_core import PG_CLEANER, stdstream_dispatcher, wrap_raylet_message_printer

BENIGN_RAY_MESSAGES = ("Token authentication is enabled for this Ray cluster",)

# Forwarded worker / actor output lines that are known to be harmless (matched with re.search).
BENIGN_FORWARDED_LINES = re.compile(
    r"Actor with class name: 'PreemptionWatcher' .*has constructor arguments in the object store"
    r".*ray-project/ray/issues/53727"
    # Ray Data in a streamed run's SplitCoordinator actors (data.ray_mode=stream): its INFO summary per epoch
    # and the note that progress bars are off (we turn them off), forwarded from the actor's own logger.
    r"|Progress bars disabled\. To enable, set `ray\.data\.DataContext"
    r"|Dataset \S+ execution finished in [0-9.]+ seconds$"
    # A PlacementGroupCleaner doing its job: the Train controller it watched is gone (a sweep's stopped or
    # paused trial) and it removes that run's placement group.
    r"|^Detected that the Ray Train controller actor \([0-9a-f]+\) is dead\. Cleaning up placement group"
    # ... and its watch over a slow state API (a saturated or restarting head): it retries on its own; a sweep's
    # reaper removes what it could not (seen a dozen times in one streamed run with a killed worker, issue 34).
    r"|^Failed to query Ray Train Controller actor state\. State API may be temporarily unavailable\. "
    r"Continuing to monitor\.$"
    # Tune's INFO in a PBT trial's new process as it starts from a donor's checkpoint (logged before the trial
    # function runs; the trial's MLflow run records the exploit).
    r"|^Restored on \S+ from checkpoint: Checkpoint\(filesystem="
    # torch's c10d store on hosts whose addresses have no reverse DNS (separate hosts: cluster.sim, many clouds):
    # it cannot name the peer in its own log line; the connection itself is fine.
    r"|\[c10d\] The hostname of the client socket cannot be retrieved\. err=-?\d+$"
)


class _DropMessages(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not record.getMessage().startswith(self.prefixes)
        except Exception:  # a record that cannot format: let logging report it as usual
            return True


def quiet_ray_driver_logs() -> None:
    """Drop the known-benign driver-side Ray log messages (call before ``ray.init``). Idempotent. The filter sits
    on the handlers of Ray's public ``ray`` logger, which every Ray module's logger propagates to."""
    for handler in logging.getLogger("ray").handlers:
        if not any(isinstance(f, _DropMessages) for f in handler.filters):
            handler.addFilter(_DropMessages(BENIGN_RAY_MESSAGES))


# Forwarded blocks (one batch): a start line, a traceback, and an end line; dropped only when all three match.
BENIGN_FORWARDED_BLOCKS = (
    # The Train controller's WARNING when its call to the autoscaling coordinator times out (CPUs saturated).
    (re.compile(r"^Failed to send resource request for train-"), re.compile(r"^ray\.exceptions\.GetTimeoutError: ")),
    # Ray Train's detached PlacementGroupCleaner asks the state API for "the" local cluster without an address;
    # with a second Ray instance on the machine its monitor thread dies on its first check. The controller still
    # stops it when the run ends, and a sweep's reaper removes what a stopped trial's controller left.
    (re.compile(r"^Exception in thread PlacementGroupCleanerMonitor:$"),
     re.compile(r"^ConnectionError: Found multiple active Ray instances: ")),
)


def _block_end(lines: list[Any], i: int) -> int | None:
    """The index after the benign block starting at ``lines[i]``, or None when none starts there."""
    for start, end in BENIGN_FORWARDED_BLOCKS:
        after = _block_at(lines, i, start, end)
        if after is not None:
            return after
    return None


def _block_at(lines: list[Any], i: int, start: re.Pattern[str], end: re.Pattern[str]) -> int | None:
    """The index after a block at ``lines[i]``: a line matching ``start``, a traceback, a line matching ``end``;
    None when there is none."""
    if not (isinstance(lines[i], str) and start.search(lines[i])):
        return None
    return _traceback_end(lines, i + 1, end)


def _traceback_end(lines: list[Any], j: int, end: re.Pattern[str]) -> int | None:
    """The index after a traceback at ``lines[j]`` (``Traceback``, indented frames) whose last line matches
    ``end``; None when there is none."""
    if not (j < len(lines) and isinstance(lines[j], str) and lines[j].startswith("Traceback")):
        return None
    j += 1
    while j < len(lines) and isinstance(lines[j], str) and lines[j].startswith(" "):
        j += 1
    return j + 1 if j < len(lines) and isinstance(lines[j], str) and end.search(lines[j]) else None


# The Train controller's traceback as it shuts down a worker group one of whose workers died (Ray's own words:
# "expected if one of the workers has crashed"): ~25 lines, the reason in the last few. One line takes its place.
_WORKER_DIED_START = re.compile(
    r"^Graceful shutdown of backend failed\. This is expected if one of the workers has crashed\.$")
_WORKER_DIED_END = re.compile(r"^ray\.exceptions\.ActorDiedError: ")
# ... or the worker cannot be reached: its host is gone or cut off (Ray's RPC fails before the GCS declares the
# node dead). The exception names the actor only by id.
_WORKER_UNREACHABLE_END = re.compile(r"^ray\.exceptions\.ActorUnavailableError: The actor [0-9a-f]+ is unavailable: "
                                     r"(?:The actor is temporarily unavailable: )?(.+)$")
_DEATH_FIELDS = re.compile(r"^\t(class_name|pid|ip): (\S+)$")
_DEATH_CAUSE = re.compile(r"Worker exit type: (\S+) Worker exit detail: (.+?)(?:\. |\.?$)")


def _worker_death(lines: list[Any], i: int) -> tuple[int, str] | None:
    """``(index after the block, its one-line summary)`` when a worker-death block starts at ``lines[i]``."""
    j = _block_at(lines, i, _WORKER_DIED_START, _WORKER_DIED_END)
    if j is None:
        j = _block_at(lines, i, _WORKER_DIED_START, _WORKER_UNREACHABLE_END)
        if j is None:
            return None
        why = _WORKER_UNREACHABLE_END.match(lines[j - 1]).group(1).split(";")[0]  # gRPC's detail after ";"
        return j, (f"a worker is unreachable (its host is gone or cut off: {why}); the worker group restarts from "
                   "its last checkpoint")
    fields: dict[str, str] = {}
    cause = None
    while j < len(lines) and isinstance(lines[j], str) and (lines[j].startswith("\t")
                                                            or lines[j].startswith("The actor is dead because")):
        if m := _DEATH_FIELDS.match(lines[j]):
            fields[m.group(1)] = m.group(2)
        cause = cause or _DEATH_CAUSE.search(lines[j])
        j += 1
    who = " ".join(x for x in (fields.get("class_name", "a worker"), f"pid {fields['pid']}" if "pid" in fields else "",
                                f"on {fields['ip']}" if "ip" in fields else "") if x)
    why = f": {cause.group(2)} ({cause.group(1)})" if cause else ""
    return j, f"{who} died{why}; the worker group restarts from its last checkpoint"


# A worker's training function failing on gloo's lost connection to a peer (the peer's process or host is gone):
# Ray Train's "Error in training function:" and a ~20-line traceback down to torch's all_reduce. One line.
_TRAIN_FN_ERROR = re.compile(r"^Error in training function:$")
_PEER_LOST_END = re.compile(r"^RuntimeError: \[[^\]]*gloo[^\]]*\] .*?"
                            r"(Connection reset by peer|Connection closed by peer|Socket Timeout|Timed out waiting)")


def _peer_lost(lines: list[Any], i: int) -> tuple[int, str] | None:
    """``(index after the block, its one line)`` when a gloo lost-peer failure of a worker starts at ``lines[i]``."""
    j = _block_at(lines, i, _TRAIN_FN_ERROR, _PEER_LOST_END)
    if j is None:
        return None
    reason = _PEER_LOST_END.search(lines[j - 1]).group(1)
    while j < len(lines) and lines[j] == "":
        j += 1
    return j, f"this worker's process group lost a peer (gloo: {reason}); its group ends and restarts without it"


def without_benign_blocks(lines: list[Any]) -> list[Any]:
    """``lines`` less each benign block: its start line, a traceback, and its end line (all or nothing); a worker
    death's block becomes one line with what died and why."""
    out, i = [], 0
    while i < len(lines):
        after = _block_end(lines, i)
        if after is not None:
            i = after
            continue
        death = _worker_death(lines, i) or _peer_lost(lines, i)
        if death is not None:
            i = death[0]
            out.append(death[1])
            continue
        out.append(lines[i])
        i += 1
    return out


# A process's crash dump as Ray's C++ signal handler writes it to the worker's stderr (abseil's failure handler):
# "*** SIGABRT received at time=... on cpu N ***", "PC: @ ...", the "    @ 0x..." frames, the same lines again under
# Ray's "[date E pid tid] logging.cc:N:" prefix, then Python's faulthandler ("Fatal Python error: Aborted", thread
# stacks, "Extension modules: ..."). A SIGTERM's is a process Ray ended itself (a worker group torn down): nothing
# for the run. A crash's (SIGABRT, SIGSEGV, ...) becomes one line naming the signal; a C++ check that failed first
# ("[mutex.cc : 1954] RAW: Check ... failed: ...") stays, since it says why. The worker's .err file keeps it all.
# Ray Train's own helper actors that it kills at every worker group's end (its PreemptionWatcher) print nothing:
# seen once in a full `make test` (Ray 2.60, 2026-12-05), the watcher aborting on a corrupt mutex as it was killed
# while a killed worker's group was torn down.
_LOGGED = r"(?:\[[^\]]*\] logging\.cc:\d+: )?"
_SIGNAL = re.compile(r"^" + _LOGGED + r"\*\*\* (SIG[A-Z]+) received at time=\d+ on cpu \d+ \*\*\*$")
_DUMP_LINE = re.compile(
    r"^" + _LOGGED + r"(?:PC: @ |\s+@\s+0x[0-9a-f]+\s)"
    r"|^Fatal Python error: |^Extension modules: |^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):"
    r"|^  File \".*\", line \d+ in \S+$|^\s*$")
_CHECK_FAILED = re.compile(r"^\[\S+ : \d+\] RAW: Check .* failed")
TEARDOWN_HELPERS = frozenset({"PreemptionWatcher"})
# Ray Train's detached PlacementGroupCleaner prints only about itself: its duty done (a dead controller's group
# removed), or its monitor thread's failure where the state API cannot serve it (no dashboard, a second Ray on the
# host, a token it does not have; a sweep's reaper removes what it could not). Its log file keeps all of it.
SILENT_HELPERS = frozenset({PG_CLEANER})


def crash_line(signal: str) -> str:
    return f"this process ended on {signal} (its crash dump is in its worker .err log under the Ray session's logs/)"


# The GCS's Redis gone (GCS fault tolerance): Ray 2.60's GCS logs every failed Redis command and each retry (~200
# lines in its last 3 s, measured on cluster.sim) and the log monitor forwards them to every driver. The skip regex
# drops them (SKIP_REGEX); the driver's watch says what happened in one line (launch/gcs_store.py). A request whose
# binary arguments held line breaks arrives in pieces that are not log lines of their own: only the block wrapper
# (console_blocks) can drop those, by remembering that the GCS's Redis errors have begun.
GCS_REDIS_LINES = re.compile(r"redis_context\.cc:\d+: (?:Redis command submission failed: |Redis request \[|Failed to "
                             r"run redis cmds: )|\] failed due to error Redis connection ")
_GCS_LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+ [A-Z] ")


class _WithoutBenignLines:
    """Wraps Ray's handler for forwarded output: the batch less the known-benign lines. It remembers which
    processes are printing a crash dump, since a dump may come in more than one batch, and whether the GCS's
    Redis errors have begun."""

    def __init__(self, inner: Callable[[dict[str, Any]], None]):
        self.inner = inner
        self._dumping: dict[tuple[Any, Any], None] = {}  # (ip, pid) of processes whose dump has started
        self._gcs_redis_seen = False

    def _without_gcs_redis_errors(self, lines: list[Any]) -> list[Any]:
        """The GCS's Redis errors, and once they have begun the pieces of failed requests (not log lines of their
        own) and the stack trace of the GCS's FATAL."""
        if not self._gcs_redis_seen and not any(isinstance(x, str) and GCS_REDIS_LINES.search(x) for x in lines):
            return lines
        self._gcs_redis_seen = True
        return [line for line in without_raylet_stack_traces(lines)
                if not isinstance(line, str) or (_GCS_LOG_LINE.match(line) and not GCS_REDIS_LINES.search(line))]

    def _without_crash_dumps(self, data: dict[str, Any], lines: list[Any]) -> list[Any]:
        key, helper = (data.get("ip"), data.get("pid")), data.get("actor_name") in TEARDOWN_HELPERS
        if key not in self._dumping and not any(
                isinstance(line, str) and (_SIGNAL.search(line) or helper and _CHECK_FAILED.search(line))
                for line in lines):
            return lines
        out: list[Any] = []
        for line in lines:
            if not isinstance(line, str):
                out.append(line)
            elif m := _SIGNAL.search(line):
                if key not in self._dumping and m.group(1) != "SIGTERM" and not helper:
                    out.append(crash_line(m.group(1)))
                self._dumping[key] = None
                while len(self._dumping) > 256:  # bounded: a dump is its process's last output
                    del self._dumping[next(iter(self._dumping))]
            elif key in self._dumping and _DUMP_LINE.search(line):
                continue
            elif helper and _CHECK_FAILED.search(line):
                continue
            else:
                out.append(line)
        return out

    def __call__(self, data: dict[str, Any]) -> None:
        if data.get("actor_name") in SILENT_HELPERS:
            return
        lines = data.get("lines") or []
        kept = [line for line in without_benign_blocks(lines)
                if not (isinstance(line, str) and BENIGN_FORWARDED_LINES.search(line))]
        kept = self._without_crash_dumps(data, kept)
        if data.get("pid") == "raylet":
            kept = without_raylet_stack_traces(kept)
        elif data.get("pid") == "gcs_server":
            kept = self._without_gcs_redis_errors(kept)
        if kept != lines:
            if not kept:
                return
            data = {**data, "lines": kept}
        self.inner(data)


# A raylet's C++ FATAL: its line, then "*** StackTrace Information ***" and ~20 frames. The line stays (it says
# why); the frames go (that node's raylet.out keeps them). A raylet that the head declared dead (its host was cut
# off past the health check) learns it when its link returns and exits so: Ray 2.60's FATAL from node_manager.cc
# (one of two, by which message told it first: its check-alive reply, or the GCS's node-removed notice) becomes a
# line that says what happened and what brings the host back.
_DECLARED_DEAD = re.compile(r"GCS consider this node to be dead\.|has mistakenly been marked as dead by the GCS")
_STACK_START = "*** StackTrace Information ***"
_FRAME = re.compile(r"^\s*\S+\(\S*\+0x[0-9a-f]+\) \[0x[0-9a-f]+\]")
DECLARED_DEAD_LINE = ("this node's raylet exits: the head declared the node dead while it could not be reached "
                      "(a host rejoins with cluster/local/add-worker.sh --rejoin); the trace is in its raylet.out")
TRACE_LINE = "(its C++ stack trace is in that node's raylet.out)"


def without_raylet_stack_traces(lines: list[Any]) -> list[Any]:
    """A raylet's batch less its C++ stack traces (one short line in place of each), a declared-dead FATAL
    replaced by :data:`DECLARED_DEAD_LINE`; everything else as it came."""
    if not any(isinstance(line, str) and (_STACK_START in line or _DECLARED_DEAD.search(line)) for line in lines):
        return lines
    out: list[Any] = []
    in_trace = dead = False
    for line in lines:
        if not isinstance(line, str):
            out.append(line)
        elif _DECLARED_DEAD.search(line):
            dead = True
            if DECLARED_DEAD_LINE not in out:
                out.append(DECLARED_DEAD_LINE)
        elif _STACK_START in line:
            in_trace = True
            if not dead:
                out.append(TRACE_LINE)
        elif in_trace and (_FRAME.match(line) or not line.strip()):
            continue
        else:
            in_trace = False
            out.append(line)
    return out


# What a raylet pushes to every driver on the cluster, known to be harmless for a run: the startup-concurrency
# WARNING on a small machine (a streamed run's Ray Data tasks and a worker group's restart start many processes at
# once; the raylet's own log keeps it).
BENIGN_RAYLET_LINES = re.compile(
    r"^WARNING: \d+ PYTHON worker processes have been started on node: \S+ with address: \S+, which is \d+x the "
    r"maximum expected startup concurrency"
)

# What a lost or cut-off host makes the head and the driver print, each said again by the run's own lines (the
# worker group shrinks, restarts from its checkpoint, grows back): the raylet's "marked dead" notice, the driver's
# lost-object recovery, the GCS's bundle removal, the head's "Raylet is terminated" push (its tail is the dead
# raylet's log), and a raylet's state dump and memory-monitor warnings quoted in it. Their logs keep all of it.
LOST_HOST_LINES = re.compile(
    r"has been marked dead because the detector has missed too many heartbeats"
    r"|:info_message: Attempting to recover \d+ lost objects"
    r"|gcs_placement_group_scheduler\.cc:\d+: Failed to remove \d+ bundle"
    r"|^Raylet is terminated\. Termination is unexpected\."
    # a cut-off host's raylet, back, learns the head declared it dead and exits (C++ FATAL): the run already went
    # on without it, and cluster/local's --rejoin joins it again
    r"|GCS consider this node to be dead\.|has mistakenly been marked as dead by the GCS"
    r"|\[state-dump\]|memory_monitor_utils\.cc:\d+: Got negative used memory"
    # a raylet's C++ stack trace under its FATAL (the FATAL line itself, which says why, stays)
    r"|\*\*\* StackTrace Information \*\*\*|^\s*\S+\(\S*\+0x[0-9a-f]+\) \[0x[0-9a-f]+\]"
)

# A process Ray ends with SIGTERM (a worker group torn down, Ray Train's PreemptionWatcher at every group's end)
# writes abseil's signal report: "*** SIGTERM received ...", then C++ frames. Nothing for the run; a crash's report
# (SIGABRT, SIGSEGV) keeps its first line and Python's "Fatal Python error", only the C++ frames go.
TEARDOWN_DUMP_LINES = re.compile(
    r"\*\*\* SIGTERM received at time=\d+ on cpu \d+ \*\*\*$"
    r"|^(?:\[[^\]]*\] logging\.cc:\d+: )?(?:PC: @ |\s+@\s+0x[0-9a-f]+\s)"
)

SKIP_REGEX = "|".join(f"(?:{r.pattern})" for r in (BENIGN_FORWARDED_LINES, BENIGN_RAYLET_LINES, LOST_HOST_LINES,
                                                     TEARDOWN_DUMP_LINES, GCS_REDIS_LINES))
SKIP_ENV = "RAY_DEDUP_LOGS_SKIP_REGEX"


def export_skip_regex() -> None:
    """Export :data:`SKIP_REGEX` for Ray's log deduplicator in this process (and those it starts): call before
    ``import ray``, which reads it once. A regex the user exported is kept: a line matching either is dropped."""
    theirs = os.environ.get(SKIP_ENV)
    if theirs is None or SKIP_REGEX in theirs:
        os.environ[SKIP_ENV] = theirs or SKIP_REGEX
    else:
        os.environ[SKIP_ENV] = f"{SKIP_REGEX}|(?:{theirs})"


# The head's push when a raylet ends: "Raylet is terminated. Termination is unexpected. ... Last 20 lines of the
# Raylet logs:" and that tail, which for a FATAL is its stack trace: the message up to the tail stays, the tail
# goes (raylet.out keeps it); for a node declared dead (the FATAL's message, or its frames: the check-alive reply
# or the node-removed notice that told the raylet) one line says so.
_RAYLET_TERMINATED = re.compile(r"^Raylet is terminated\. Termination is unexpected\.")
_TAIL = "Last 20 lines of the Raylet logs:"
_DEAD_IN_TAIL = re.compile(_DECLARED_DEAD.pattern + r"|NodeInfoAccessor::AsyncCheckAlive|NodeManager::NodeRemoved")
TERMINATED_DECLARED_DEAD_LINE = ("Raylet is terminated: the head had declared its node dead while it could not be "
                                 "reached (a host rejoins with cluster/local/add-worker.sh --rejoin)")


# The raylet's push when a worker process dies unexpectedly: one line of ~1500 characters (ids, the exit detail,
# then a paragraph of common causes and advice). What it says is kept, in one short line; the advice about OOM
# and resource isolation goes (the exit detail says OOM when it was one). A Train worker's death is also our
# controller's own line ("RayTrainWorker pid N ... died: ...; the worker group restarts ...").
_WORKER_DIED = re.compile(
    r"^A worker died or was killed while executing a task by an unexpected system error\..*?"
    r"Worker ID: (?P<worker>[0-9a-f]+).*?Worker IP address: (?P<ip>\S+).*?Worker PID: (?P<pid>\d+).*?"
    r"Worker exit type: (?P<type>\S+) Worker exit detail: (?P<detail>.*?)(?: Some common causes include:.*)?$",
    re.DOTALL,
)


def _worker_died(line: Any) -> Any:
    m = _WORKER_DIED.search(line) if isinstance(line, str) else None
    if m is None:
        return line
    return (f"a worker process died unexpectedly: pid {m['pid']} on {m['ip']} ({m['type']}: "
            f"{m['detail'].strip().rstrip('.')}); its logs: logs/worker-{m['worker']}-* on that node")


def _terminated(line: Any) -> Any:
    if not (isinstance(line, str) and _RAYLET_TERMINATED.search(line)):
        return line
    if _DEAD_IN_TAIL.search(line):
        return TERMINATED_DECLARED_DEAD_LINE
    if _TAIL in line and _STACK_START in line:
        return line.split(_TAIL, 1)[0] + "Its last log lines are in that node's raylet.out."
    return line


class _WithoutBenignRayletLines:
    """Wraps Ray's ``print_to_stdstream``: a raylet's batch less its known-benign lines."""

    def __init__(self, inner: Callable[..., None]):
        self.inner = inner

    def __call__(self, data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            lines = data.get("lines") or []
            kept = [_worker_died(_terminated(line)) for line in lines
                    if not (isinstance(line, str) and BENIGN_RAYLET_LINES.search(line))]
            if not kept:
                return
            if kept != lines:
                data = {**data, "lines": kept}
        self.inner(data, ignore_prefix)


def filter_forwarded_lines() -> bool:
    """Wrap the driver's printer of forwarded worker output (call after ``ray.init``); True when it is wrapped.
    Only with the internal feature ``console_blocks`` (module docstring); without it, :data:`SKIP_REGEX` alone.

    Uses Ray's private ``global_worker_stdstream_dispatcher`` (``ray.init(log_to_driver=True)`` registers the
    printer there as ``"ray_print_logs"``), and Ray's printer of what raylets push to every driver
    (:func:`~elastic_train.compat.ray_core.wrap_raylet_message_printer`). Any change in those internal APIs leaves
    Ray's printers untouched, and the benign lines are printed again.
    """
    if not features.enabled("console_blocks"):
        return False
    try:
        dispatcher = stdstream_dispatcher()
        with dispatcher._lock:
            wrapped = False
            handlers = []
            for name, handler in dispatcher.handlers:
                if name == "ray_print_logs" and not isinstance(handler, _WithoutBenignLines):
                    handler = _WithoutBenignLines(handler)
                wrapped = wrapped or isinstance(handler, _WithoutBenignLines)
                handlers.append((name, handler))
            dispatcher.handlers = handlers
    except Exception as e:  # checked by the feature; anything else: print everything, as Ray does
        logging.getLogger(__name__).warning("console_blocks off: Ray's forwarded-output printer not wrapped (%s)", e)
        return False
    try:
        return wrap_raylet_message_printer(_WithoutBenignRayletLines) and wrapped
    except Exception as e:  # likewise: the raylet's lines are printed as Ray prints them
        logging.getLogger(__name__).warning("console_blocks off: Ray's raylet-message printer not wrapped (%s)", e)
        return False
