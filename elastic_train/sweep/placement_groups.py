"""Workaround for ray#54305: placement groups left behind by Tune trials that ASHA stopped early.

What happens (measured with Ray 2.60, see README "Sweeps"): Tune stops a trial by ending its actor. The trial's
Ray Train controller is owned by that actor and dies with it, and so do the workers; but the workers'
placement group was created by the controller, and Ray removes an actor-created placement group only when
both its creator actor *and its job* are dead. The job -- the sweep's driver -- is alive, so the group stays
CREATED and holds the workers' CPUs/GPUs until the sweep ends.

**Public path.** Ray Train starts a detached ``PlacementGroupCleaner`` per run to cover this: it asks the state
API (the dashboard) whether the controller lives and removes the group when it does not. That works where the
dashboard runs and Ray is alone on its host (an embedded Ray on a laptop, a cluster's head); without a dashboard,
or with several Ray instances on one host, its query fails, the group is never removed and the next trial waits
for resources no one holds: the sweep deadlocks.

**Internal path** (feature ``sweep_reaper``, on by default): :class:`OrphanedPlacementGroupReaper` is a Tune
callback on the sweep's driver. After each trial that ends (and every :data:`IDLE_EVERY_S` otherwise), and when
the experiment ends, it asks the GCS (no dashboard needed) for this job's placement groups whose creator actor is
dead and removes them -- such a group has no owner left that could use it, so removing it is always safe -- and
ends the cleaners whose controller is dead, their duty done. Each scan asks the GCS for this job's actors only,
in the state wanted (the GCS filters): its cost is what this sweep holds, not what the cluster's history holds.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.tune import Callback

from elastic_train.compat import features
from elastic_train.compat.ray_core import (
    PG_CLEANER,
    TRAIN_CONTROLLER,
    gcs_actors,
    kill_actors,
    live_actor_created_groups,
)
from elastic_train.launch.reservations import release_dead_runs_requests

log = logging.getLogger(__name__)


def _job() -> str:
    return ray.get_runtime_context().get_job_id()


def orphaned_placement_groups(job_id: str | None = None) -> list[str]:
    """Hex ids of the live, non-detached, actor-created placement groups of ``job_id`` whose creator died."""
    return [g["id"] for g in live_actor_created_groups(job_id or _job()) if not g["detached"] and g["creator_dead"]]


def remove_orphaned_placement_groups(job_id: str | None = None) -> list[str]:
    """Remove what :func:`orphaned_placement_groups` finds; returns the ids removed."""
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    removed = []
    for pg_id in orphaned_placement_groups(job_id):
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
            removed.append(pg_id)
        except Exception as e:  # a GCS hiccup must not stop the sweep; the next scan retries
            log.warning("placement group %s not removed yet (%s): the next scan retries", pg_id, e)
    return removed


def settle(timeout_s: float = 15.0) -> None:
    """After a sweep: wait until no placement group of this job created by an actor is live, removing orphans.

    The last stopped trials' controllers die a moment after their trial actors; until Ray marks them dead
    their groups are not yet orphans. Public path: Ray's cleaners remove them; nothing to wait for here.
    """
    if not features.enabled("sweep_reaper"):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        started = time.perf_counter()
        OrphanedPlacementGroupReaper.removed.extend(remove_orphaned_placement_groups())
        ended = end_stranded_cleaners()
        count_scan(started)
        if not ended and not actor_created_placement_groups():
            return
        time.sleep(0.5)


def count_scan(started: float) -> None:
    """Count one scan that began at ``started`` (``time.perf_counter``): bench/scan_cost.py reports their share of
    a sweep's wall on a cluster whose actor table holds thousands of other jobs' dead actors."""
    OrphanedPlacementGroupReaper.scans["count"] += 1
    OrphanedPlacementGroupReaper.scans["seconds"] += time.perf_counter() - started


def scan_totals() -> dict[str, float]:
    """Every scan so far in this process: ``{"count", "seconds"}``."""
    return {"count": int(OrphanedPlacementGroupReaper.scans["count"]),
            "seconds": round(OrphanedPlacementGroupReaper.scans["seconds"], 4)}


def actor_created_placement_groups(job_id: str | None = None) -> list[str]:
    """Hex ids of this job's live placement groups that an actor created (Train runs' worker groups)."""
    return [g["id"] for g in live_actor_created_groups(job_id or _job())]


def stranded_cleaners(job_id: str | None = None) -> list[str]:
    """Hex ids of live ``PlacementGroupCleaner`` actors (detached) whose Train controller of this job is dead.

    Their one duty -- removing the dead controller's placement group -- is done here; without a working state
    API they never learn that the controller died, and live (polling once a second) until the cluster stops.
    A cleaner's owner is its controller, matched by worker id (an address can be reused by a later process).
    """
    job = job_id or _job()
    alive = gcs_actors(job, "ALIVE", PG_CLEANER)
    if not alive:
        return []
    dead_controllers = {a["worker"] for a in gcs_actors(job, "DEAD", TRAIN_CONTROLLER)}
    return [a["id"] for a in alive if a["owner_worker"] in dead_controllers]


def end_stranded_cleaners(job_id: str | None = None) -> int:
    """End what :func:`stranded_cleaners` finds, as ``ray.kill`` ends an actor (an intended exit: no raylet
    "worker died ... unexpected system error" line, no ``SystemExit`` traceback on the console, as ending the
    process with a signal printed). They are unnamed and this process holds no handle to them."""
    return kill_via_gcs(stranded_cleaners(job_id))


def own_train_controllers() -> list[str]:
    """Hex ids of the live Ray Train controllers this process created (its trials' ``fit``)."""
    me = ray.get_runtime_context().get_worker_id()
    return [a["id"] for a in gcs_actors(_job(), "ALIVE", TRAIN_CONTROLLER) if a["owner_worker"] == me]


def kill_via_gcs(ids: list[str]) -> int:
    """End the actors ``ids`` as ``ray.kill`` does, without a handle (the GCS's kill call takes the id)."""
    return kill_actors(ray.get_runtime_context().gcs_address, ids)


class OrphanedPlacementGroupReaper(Callback):
    """Tune callback: remove orphaned placement groups after each trial that ends (every ``every_s`` seconds for
    ``busy_s`` after it, until its controller's death shows), every ``idle_every_s`` otherwise, and at the end."""

    removed: list[str] = []  # every id removed in this process (class-level: Tune may restore a pickled copy)
    # every scan in this process and the seconds they took (the sweep's summary: ``placement_group_scans``)
    scans: dict[str, float] = {"count": 0, "seconds": 0.0}

    def __init__(self, every_s: float = 2.0, expected: bool = False, busy_s: float = 30.0,
                 idle_every_s: float = 30.0, release_requests: bool = False):
        self.every_s, self.busy_s, self.idle_every_s = every_s, busy_s, idle_every_s
        # elastic trials: what stopped, paused or failed trials' Train runs still reserve with the coordinator
        # (launch/reservations.py, feature dead_run_requests)
        self.release_requests = release_requests
        self._last = 0.0
        self._busy_until = 0.0
        # expected: the scheduler pauses trials as a matter of course (PBT: every exploit, and every trial
        # waiting at a sync point, ends a trial's Ray Train run), so each pause leaves a group: no warning.
        self.expected = expected

    def reap(self) -> None:
        started = time.perf_counter()
        try:
            removed = remove_orphaned_placement_groups()
            end_stranded_cleaners()
            if getattr(self, "release_requests", False) and features.enabled("dead_run_requests"):
                release_dead_runs_requests()
        except Exception as e:  # a GCS hiccup must not stop the sweep; the next scan retries
            log.warning("could not scan placement groups: %s", e)
            return
        finally:
            count_scan(started)
        if removed:
            (log.debug if getattr(self, "expected", False) else log.warning)(
                "removed %d placement group(s) left by stopped trials (ray#54305)", len(removed))
            OrphanedPlacementGroupReaper.removed.extend(removed)

    def _trial_ended(self) -> None:
        self._busy_until = time.monotonic() + self.busy_s

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._trial_ended()

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._trial_ended()

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        now = time.monotonic()
        period = self.every_s if now < self._busy_until or getattr(self, "expected", False) else self.idle_every_s
        if now - self._last >= period:
            self._last = now
            self.reap()

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self.reap()
