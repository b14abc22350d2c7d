"""Workaround for ray#54305: placement groups left behind by Tune trials that ASHA stopped early.

What happens (measured with Ray 2.60, see README "Sweeps"): Tune stops a trial by ending its actor. The trial's
Ray Train controller is owned by that actor and dies with it, and so do the workers; but the workers'
placement group was created by the controller, and Ray removes an actor-created placement group only when
both its creator actor *and its job* are dead. The job -- the sweep's driver -- is alive, so the group stays
CREATED and holds the workers' CPUs/GPUs until the sweep ends. Ray Train starts a detached
``PlacementGroupCleaner`` per run to cover this, but it asks the state API (the dashboard) whether the
controller lives, and fails where there is no dashboard or several Ray instances share the host. The next
trial's Train run then waits forever for resources that no one holds: the sweep deadlocks. (Without a
dashboard the detached cleaner also never exits: it polls, and warns, once a second until the cluster stops.)

:class:`OrphanedPlacementGroupReaper` is a Tune callback on the sweep's driver. Every couple of seconds, and
when the experiment ends, it asks the GCS (no dashboard needed) for this job's placement groups whose creator
actor is dead and removes them -- such a group has no owner left that could use it, so removing it is always
safe -- and ends the cleaners whose controller is dead, their duty done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import ray
from ray.tune import Callback

from elastic_train.compat.ray_core import actor_table
from elastic_train.launch.reservations import release_dead_runs_requests

log = logging.getLogger(__name__)

LIVE_STATES = ("PENDING", "PREPARED", "CREATED", "RESCHEDULING")


def _live_actor_created_groups(job_id: str | None) -> Iterator[Any]:
    """GCS records of ``job_id``'s (default: ours) live placement groups that an actor created (Train runs' worker
    groups; Tune's trial groups are created by the driver)."""
    from ray.core.generated import gcs_pb2

    from elastic_train.compat.ray_core import placement_group_records

    job_id = job_id or ray.get_runtime_context().get_job_id()
    for raw in placement_group_records():
        pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
        state_name = gcs_pb2.PlacementGroupTableData.PlacementGroupState.Name(pg.state)
        if state_name in LIVE_STATES and pg.creator_job_id.hex() == job_id and pg.creator_actor_id \
                and not ray.ActorID(pg.creator_actor_id).is_nil():
            yield pg


def orphaned_placement_groups(job_id: str | None = None) -> list[str]:
    """Hex ids of the live, non-detached, actor-created placement groups of ``job_id`` whose creator died."""
    return [pg.placement_group_id.hex() for pg in _live_actor_created_groups(job_id)
            if not pg.is_detached and pg.creator_actor_dead]


def remove_orphaned_placement_groups(job_id: str | None = None) -> list[str]:
    """Remove what :func:`orphaned_placement_groups` finds; returns the ids removed."""
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    removed = []
    for pg_id in orphaned_placement_groups(job_id):
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
            removed.append(pg_id)
        except Exception as e:  # a GCS hiccup must not stop the sweep; the next step retries
            log.debug("placement group %s: %s", pg_id, e)
    return removed


def settle(timeout_s: float = 15.0) -> None:
    """After a sweep: wait until no placement group of this job created by an actor is live, removing orphans.

    The last stopped trials' controllers die a moment after their trial actors; until Ray marks them dead
    their groups are not yet orphans.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        OrphanedPlacementGroupReaper.removed.extend(remove_orphaned_placement_groups())
        ended = end_stranded_cleaners()
        if not ended and not actor_created_placement_groups():
            return
        time.sleep(0.5)


def actor_created_placement_groups(job_id: str | None = None) -> list[str]:
    """Hex ids of this job's live placement groups that an actor created (Train runs' worker groups)."""
    return [pg.placement_group_id.hex() for pg in _live_actor_created_groups(job_id)]


def stranded_cleaners(job_id: str | None = None, actors: list[Any] | None = None) -> list[str]:
    """Hex ids of live ``PlacementGroupCleaner`` actors (detached) whose Train controller of this job is dead.

    Their one duty -- removing the dead controller's placement group -- is done here; without a working state
    API they never learn that the controller died, and live (polling once a second) until the cluster stops.
    A cleaner's owner is its controller, matched by worker id (an address can be reused by a later process).
    """
    from ray.core.generated import gcs_pb2

    job_id = job_id or ray.get_runtime_context().get_job_id()
    alive, dead = gcs_pb2.ActorTableData.ALIVE, gcs_pb2.ActorTableData.DEAD
    records = actor_table() if actors is None else actors
    dead_controllers = {a.address.worker_id for a in records
                        if a.class_name == "TrainController" and a.state == dead and a.job_id.hex() == job_id}
    return [a.actor_id.hex() for a in records
            if a.class_name == "PlacementGroupCleaner" and a.state == alive
            and a.owner_address.worker_id in dead_controllers]


def end_stranded_cleaners(job_id: str | None = None, actors: list[Any] | None = None) -> int:
    """End what :func:`stranded_cleaners` finds, as ``ray.kill`` ends an actor (an intended exit: no raylet
    "worker died ... unexpected system error" line, no ``SystemExit`` traceback on the console, as ending the
    process with a signal printed). They are unnamed and this process holds no handle to them, and ``ray.kill``
    needs one: the GCS's own kill call takes the actor id."""
    return kill_via_gcs(stranded_cleaners(job_id, actors))


def own_train_controllers() -> list[str]:
    """Hex ids of the live Ray Train controllers this process created (its trials' ``fit``)."""
    from ray.core.generated import gcs_pb2

    me = bytes.fromhex(ray.get_runtime_context().get_worker_id())
    return [a.actor_id.hex() for a in actor_table() if a.class_name == "TrainController"
            and a.state == gcs_pb2.ActorTableData.ALIVE and a.owner_address.worker_id == me]


def kill_via_gcs(ids: list[str]) -> int:
    """End the actors ``ids`` as ``ray.kill`` does, without a handle (the GCS's kill call takes the id)."""
    if not ids:
        return 0
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    from elastic_train.compat.ray_core import gcs_channel

    channel = gcs_channel(ray.get_runtime_context().gcs_address)
    try:
        actors = gcs_service_pb2_grpc.ActorInfoGcsServiceStub(channel)
        for actor_id in ids:
            actors.KillActorViaGcs(gcs_service_pb2.KillActorViaGcsRequest(
                actor_id=bytes.fromhex(actor_id), force_kill=True, no_restart=True), timeout=10)
    finally:
        channel.close()
    return len(ids)


class OrphanedPlacementGroupReaper(Callback):
    """Tune callback: remove orphaned placement groups every ``every_s`` seconds and at the end."""

    removed: list[str] = []  # every id removed in this process (class-level: Tune may restore a pickled copy)

    def __init__(self, every_s: float = 2.0, expected: bool = False):
        self.every_s = every_s
        self._last = 0.0
        # expected: the scheduler pauses trials as a matter of course (PBT: every exploit, and every trial
        # waiting at a sync point, ends a trial's Ray Train run), so each pause leaves a group: no warning.
        self.expected = expected

    def reap(self) -> None:
        try:
            removed = remove_orphaned_placement_groups()
            actors = actor_table()  # one fetch of the GCS's actor table for both scans
            end_stranded_cleaners(actors=actors)
            release_dead_runs_requests(actors)  # what paused, failed or killed trials' controllers still reserve
        except Exception as e:  # a GCS hiccup must not stop the sweep; the next step retries
            log.warning("could not scan placement groups: %s", e)
            return
        if removed:
            (log.debug if getattr(self, "expected", False) else log.warning)(
                "removed %d placement group(s) left by stopped trials (ray#54305)", len(removed))
            OrphanedPlacementGroupReaper.removed.extend(removed)

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        if time.monotonic() - self._last >= self.every_s:
            self._last = time.monotonic()
            self.reap()

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self.reap()
