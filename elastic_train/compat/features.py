"""One switch for every upstream internal: each internal serves a named feature, and each feature has a public path.

An internal (a private Ray, MLflow or torch name: :mod:`.registry` lists them all) is used only through a
:class:`Feature`: what it buys, measured, and what runs instead when it is off. A feature is used when

* the switch asks for it: ``compat.internals`` in the config, or ``$ELASTIC_TRAIN_INTERNALS`` (``on``: every
  feature whose ``default`` is on; ``off``: none, public APIs only; or a comma-separated list of names: exactly
  those), and
* the installed Ray is at least its ``since`` release, and every registry entry it relies on is still there as
  checked (:func:`elastic_train.compat.registry.problem`; once per process, cached).

Otherwise the caller takes the public path. :func:`unavailable` tells the preflight why a requested feature is
off (one line each: the feature, what it needs), so an upgrade that removed an internal degrades a run gently
and says so, while ``tests/unit/test_compat.py`` (the canary) fails loudly on the same upgrade.

``$ELASTIC_TRAIN_COMPAT_TRACE``, when it names a file, gets one line per registry entry each process uses
(:func:`note`, :func:`note_entries`, called where the internal is touched): the test that counts the private names
on the default path reads it (``tests/e2e/test_compat_count.py``).

This module imports neither Ray nor MLflow: the switch is read in every process, workers and controllers too.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass

SWITCH_ENV = "ELASTIC_TRAIN_INTERNALS"
TRACE_ENV = "ELASTIC_TRAIN_COMPAT_TRACE"
ON, OFF = "on", "off"


@dataclass(frozen=True)
class Feature:
    name: str
    buys: str  # what the internal path buys, as measured (docs/benchmarks.md)
    public: str  # what runs instead when the feature is off
    since: str = "2.55"  # the first Ray release (major.minor) with what it needs, as checked
    default: bool = True  # used under ``compat.internals=on``


FEATURES: dict[str, Feature] = {f.name: f for f in (
    Feature("train_knobs", "report() costs 0.2 s, not Ray's 2 s health poll, per checkpoint; a restart after a "
            "node loss retries its worker group sooner", "Ray Train's own poll (2 s) and start timeout (30 s)"),
    Feature("no_preemption_watcher", "no PreemptionWatcher process per worker group on an embedded (one-node) Ray",
            "Ray Train starts its watcher (one process more per worker group)", since="2.60"),
    Feature("worker_warmup", "a restarted worker imports torch._dynamo while its process group forms "
            "(recovery 1.04x -> 0.93x of bare Ray Train); gloo's interface chosen in every worker",
            "imports in the training function; gloo's interface from the node's GLOO_SOCKET_IFNAME "
            "(cluster/local scripts export it)"),
    Feature("warm_spares", "a restarted worker group starts on processes that have imported torch (recovery "
            "0.28x of bare Ray Train)", "Ray starts new worker processes at every restart"),
    Feature("sweep_reaper", "a stopped trial's placement group removed at once without the dashboard "
            "(ray#54305); Ray Train's per-trial PlacementGroupCleaner left out",
            "Ray Train's PlacementGroupCleaner (needs the dashboard's state API)"),
    Feature("trial_reuse", "the next trial runs in the last trial's process (no new process per trial)",
            "Tune starts a new process per trial (reuse_actors off)"),
    Feature("auth_probe", "a wrong or missing Ray token exits 2 in seconds", "ray.init's own error, within "
            "failure.connect_timeout_s"),
    Feature("console_blocks", "a dead worker's 25-line traceback and Ray's multi-line pushes become one line",
            "RAY_DEDUP_LOGS_SKIP_REGEX drops Ray's known-benign lines; multi-line blocks print whole",
            default=False),
    Feature("lean_callbacks", "no DatasetManager process per worker-group start, no PlacementGroupCleaner where "
            "the driver reaps (~3 s of CPU per sweep trial on 2 cores)", "Ray Train's default callbacks"),
    Feature("light_controller", "the Train controller does not import torch (1.6 s per run and per trial)",
            "Ray's TorchConfig", since="2.60", default=False),
    Feature("elastic_trials", "an elastic sweep trial starts at its minimum and grows into what stopped trials "
            "free", "each trial is Ray Train's elastic run as Ray sizes it", since="2.58"),
    Feature("dead_run_requests", "a resumed or next elastic run does not wait out a dead run's 180 s resource "
            "reservation", "Ray's 180 s expiry", since="2.57"),
    Feature("fresh_cluster_view", "after a failure an elastic run's next worker group is sized on the nodes alive "
            "now (a lost host: ~50 s less recovery on separate hosts)", "the coordinator's view of up to 20 s ago",
            since="2.60"),
    Feature("restart_markers", "the controller's phases of a restart, for bench/recovery.py and bench/chaos.py",
            "no controller-side phases in the benchmarks' JSON"),
    Feature("pbt_sync", "synchronous PBT continues the trial that completes a sync point (one Ray Train restart "
            "fewer per decision) and frees trials waiting on one that finished", "Ray's own synchronous PBT"),
    Feature("pbt_last_lr", "get_last_lr() right after a PBT exploit changed the rate",
            "the donor's rate is logged as lr until the next scheduler step"),
)}


def _requested_value() -> str:
    return os.environ.get(SWITCH_ENV, ON).strip() or ON


def parse_switch(value: str | list[str] | None) -> frozenset[str]:
    """The features ``value`` asks for (``on``, ``off``, or names). Raises ValueError naming an unknown one."""
    if value is None:
        value = ON
    if isinstance(value, str):
        if value.lower() in (ON, "true", "1", "default"):
            return frozenset(n for n, f in FEATURES.items() if f.default)
        if value.lower() in (OFF, "false", "0", "none", "public"):
            return frozenset()
        value = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in value if v not in FEATURES]
    if unknown:
        raise ValueError(f"unknown internal feature(s) {', '.join(unknown)}; known: {', '.join(FEATURES)}")
    return frozenset(value)


_CONFIGURED: list[str] = []  # what configure() last exported (a config's value), so that the next run can undo it


def configure(value: str | list[str] | None) -> None:
    """Make ``value`` (a run's ``compat.internals``) this process's switch, and the switch of every process it
    starts (they inherit the environment). None: the environment's own (``$ELASTIC_TRAIN_INTERNALS``, else on); a
    value an earlier run of this process exported is withdrawn first."""
    if value is None:
        if _CONFIGURED and os.environ.get(SWITCH_ENV) == _CONFIGURED[-1]:
            os.environ.pop(SWITCH_ENV, None)
        _CONFIGURED.clear()
        return
    parse_switch(value)
    exported = value if isinstance(value, str) else ",".join(value)
    os.environ[SWITCH_ENV] = exported
    _CONFIGURED[:] = [exported]


def switch_value() -> str:
    """The switch as every process of the run should see it (for a worker's runtime env)."""
    return _requested_value()


def process_env() -> dict[str, str]:
    """What another process of the run needs to see the same switch (and trace file) as this one: Ray's workers
    inherit the environment of the node they run on, not the driver's (a worker's runtime env, a sweep trial)."""
    return {SWITCH_ENV: switch_value(), **({TRACE_ENV: os.environ[TRACE_ENV]} if os.environ.get(TRACE_ENV) else {})}


def adopt(env: dict[str, str]) -> None:
    """In another process of the run (a sweep trial): take the driver's :func:`process_env`."""
    os.environ.update(env)


def requested(name: str) -> bool:
    """Whether the switch asks for ``name`` (whatever the installed versions have)."""
    if name not in FEATURES:
        raise KeyError(name)
    try:
        return name in parse_switch(_requested_value())
    except ValueError:  # a bad value in the environment: the config check names it; here, public only
        return False


def enabled(name: str) -> bool:
    """Whether to take ``name``'s internal path in this process: asked for, and available."""
    return requested(name) and unavailable_reason(name) is None


def note(name: str) -> None:
    """The internal path of feature ``name`` is taken here, all of its registry entries with it (a class of ours
    built on them, an override, a knob): recorded for the count of private names a run uses."""
    if not os.environ.get(TRACE_ENV):
        return
    from elastic_train.compat.registry import entries_of

    for entry in entries_of(name):
        _trace(entry.key)


def note_entries(feature: str, *parts: str) -> None:
    """The registry entries of ``feature`` whose key holds one of ``parts`` are used here: recorded for the count
    (``$ELASTIC_TRAIN_COMPAT_TRACE``). A part that names no entry is a mistake in the code: it raises (tested)."""
    if not os.environ.get(TRACE_ENV):
        return
    from elastic_train.compat.registry import entries_of

    entries = entries_of(feature)
    for part in parts:
        keys = [e.key for e in entries if part in e.key]
        if not keys:
            raise KeyError(f"no registry entry of {feature} matches {part!r}")
        for key in keys:
            _trace(key)


@functools.cache
def unavailable_reason(name: str) -> str | None:
    """Why ``name`` cannot be used with the installed versions (None: it can). Cached: checked once a process."""
    feature = FEATURES[name]
    ray_version = installed_ray()
    if ray_version is not None and _minor(ray_version) < _minor(feature.since):
        return f"needs Ray {feature.since} or newer (this is {ray_version})"
    from elastic_train.compat.registry import entries_of, problem

    for entry in entries_of(name):
        if (p := problem(entry)) is not None:
            return f"{entry.target} changed in this Ray ({p})"
    return None


def unavailable() -> list[str]:
    """One line per requested feature that is off in this process, saying why and what runs instead."""
    lines = []
    for name in sorted(parse_switch(_requested_value())):
        reason = unavailable_reason(name)
        if reason is not None:
            lines.append(f"{name} off: {reason}; instead: {FEATURES[name].public}")
    return lines


def summary_line() -> str | None:
    """One line for the preflight: the switch when off, and which requested features this Ray cannot give (None:
    everything asked for is in use)."""
    value = _requested_value()
    if not parse_switch(value):
        return "internals: off (public Ray, MLflow and torch APIs only: compat.internals / $ELASTIC_TRAIN_INTERNALS)"
    off = []
    for name in sorted(parse_switch(value)):
        reason = unavailable_reason(name)
        if reason is not None:
            off.append(f"{name} ({reason})")
    if not off:
        return None
    return f"internals: the public path instead of {', '.join(off)} (docs/config.md#compat)"


def installed_ray() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError:
        return None


def _minor(version: str) -> tuple[int, int]:
    major, minor, *_ = (int("".join(c for c in part if c.isdigit()) or 0) for part in version.split("."))
    return major, minor


_TRACED: set[tuple[str, str]] = set()


def _trace(key: str) -> None:
    path = os.environ.get(TRACE_ENV)
    if not path or (path, key) in _TRACED:
        return
    _TRACED.add((path, key))
    with contextlib.suppress(OSError), open(path, "a") as f:  # the count is a test's, never a run's concern
        f.write(f"{os.getpid()} {key}\n")
