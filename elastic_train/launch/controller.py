"""What runs inside Ray Train's controller actor for every run (Ray Train callbacks of its internal kinds), each
behind its feature of compat/features.py. With every internal off, none of it runs: Ray Train's public path.

(The controller once put itself at niceness 0 here, since Ray starts every worker process at 15; the engine now
starts an embedded Ray with Ray's public ``RAY_worker_niceness=0``, and cluster/local's scripts start nodes so.)

**A lost node seen at once** (feature ``fresh_cluster_view``, elastic runs). Ray Train's elastic policy sizes the
next worker group from what Ray's cluster-wide ``AutoscalingCoordinator`` reserves for it, and that actor refreshes
its view of the nodes on a 20 s tick. After a host is lost or cut off, the next group was planned on the stale view
(the dead node's CPUs still counted), waited out Ray Train's 30 s worker-group start timeout, and only then shrank:
~50 s of a recovery on separate hosts (tests/hosts). :class:`FreshClusterView` asks the coordinator to recompute
(its own ``recompute=True`` path, which Ray uses before it pins nodes) when the controller handles a failure, so the
next group is sized on the nodes alive now.

**No DatasetManager without Ray Data** (feature ``lean_callbacks``). At every worker-group start
(each run, each restart, each sweep trial) Ray Train's ``DatasetsCallback`` creates a ``DatasetManager`` actor, a
new Python process importing Ray and Ray Data, to hand out shards of the trainer's ``datasets``. This engine passes
none (its data reaches the workers through the object store, or streamed splits rank 0 builds: data/stream.py), so
that process only took a core for a second beside the workers starting up. :func:`leaner_default_callbacks` leaves
that callback out of a run that reads no Ray Data (a run that does keeps it: its DataContext reaches the workers
through it).

**No PlacementGroupCleaner where the caller reaps** (``lean_callbacks`` too). Ray Train starts a detached
``PlacementGroupCleaner`` actor per run (one more process: ~1.8 s of CPU, measured per sweep trial on 2 cores) to
remove the run's placement group if its controller dies without cleaning up. A sweep's driver already does that for
every trial, through the GCS and without the dashboard Ray's cleaner needs (sweep/placement_groups.py), so a trial
(``RunResources.placement_groups_reaped``) starts none. Nor does a run on an embedded Ray: that cluster is one node,
the driver's own, and ends with it. A run on its own on a cluster keeps Ray's.

**No PreemptionWatcher on an embedded Ray** (feature ``no_preemption_watcher``, launch/trainer.py
``_ray_train_env``): Ray Train starts one, a new process, at every worker-group start, restarts included, to see a
node drained ahead of its loss. Nothing drains the driver's own node but the driver's end, so there it only took
memory (~190 MB) and woke ~150 times a second beside the training threads. The workers then skip the preemption
barrier too (train/policy.py)."""

from __future__ import annotations

import logging
from typing import Any

from elastic_train.compat.ray_train import (
    ControllerCallback,
    DatasetsCallback,
    PlacementGroupCleanerCallback,
    WorkerGroupCallback,
    refresh_reservations,
)
from elastic_train.train.faults import append_marker

log = logging.getLogger(__name__)


class RecordTrainRun(ControllerCallback):
    """The controller notes itself and its Train run in the GCS, so that a later run can cancel the resource
    request it leaves if it dies without its own end (launch/reservations.py). Best effort: a failure is written
    to the run's log (``run_folder``, elastic_train/runlog.py)."""

    def __init__(self, run_folder: str | None = None):
        self.run_folder = run_folder

    def after_controller_start(self, train_run_context: Any) -> None:
        import ray

        from elastic_train import runlog
        from elastic_train.launch.reservations import record_train_run

        runlog.attach(self.run_folder)
        try:
            record_train_run(ray.get_runtime_context().get_actor_id(), train_run_context.run_id)
        except Exception as e:  # no record: Ray's 180 s expiry applies to this run, as before
            runlog.dropped("the record of this Train run in the GCS (if its controller dies, a later run waits out "
                           "Ray's 180 s expiry of its resource request)", e)


class FreshClusterView(ControllerCallback):
    """On a failure: the coordinator's reservations recomputed against the nodes alive now (bounded, best
    effort: on any error Ray's 20 s tick still applies). Feature ``fresh_cluster_view``."""

    TIMEOUT_S = 5.0

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        try:
            refresh_reservations(self.TIMEOUT_S)
        except Exception as e:
            log.warning("the coordinator's reservations were not refreshed after the failure (%s): the next worker "
                        "group is sized on its view of up to 20 s ago", e)


def leaner_default_callbacks(callbacks: list[Any], *, keep_datasets: bool, keep_pg_cleaner: bool) -> list[Any]:
    """Ray Train's default callbacks less its DatasetsCallback unless ``keep_datasets`` (a run that reads Ray Data:
    its DataContext reaches the workers through it) and less its PlacementGroupCleanerCallback unless
    ``keep_pg_cleaner`` (module docstring). Ray Train's worker takes no dataset shard provider then: this engine
    asks for no dataset shard."""
    drop = {DatasetsCallback} if not keep_datasets else set()
    if not keep_pg_cleaner:
        drop.add(PlacementGroupCleanerCallback)
    return [cb for cb in callbacks if type(cb) not in drop]


class RestartPhases(ControllerCallback, WorkerGroupCallback):
    """With ``markers=DIR`` in the fault spec (bench/recovery.py, bench/chaos.py): the controller's side of a
    restart, one JSON line per event in ``DIR/controller.jsonl`` (unix time), so a recovery splits into Ray
    Train's phases: ``controller_start`` (the controller's callbacks run; with its process's start),
    ``failure_decision`` (the failure detected), ``shutdown_done`` (the old group torn down), ``group_start``
    (placement begins), ``group_ready`` (actors up, process group formed), ``training_started``
    (the function dispatched). The workers note ``context`` (train/warmup.py) and their own phases
    (train/faults.py). Best effort: a write that fails is dropped."""

    def __init__(self, markers: str):
        self.markers = markers

    def _note(self, event: str, **fields: Any) -> None:
        try:
            append_marker(self.markers, "controller.jsonl", event, **fields)
        except OSError:
            pass

    def after_controller_start(self, train_run_context: Any) -> None:
        from elastic_train.train.process_info import process_start_unix

        self._note("controller_start", process_start=process_start_unix())

    def before_controller_execute_failure_decision(self, failure_decision: Any) -> None:
        self._note("failure_decision", decision=str(getattr(failure_decision, "name", failure_decision)))

    def after_worker_group_shutdown(self, worker_group_context: Any) -> None:
        self._note("shutdown_done")

    def after_worker_group_abort(self, worker_group_context: Any) -> None:
        self._note("shutdown_done", abort=True)

    def before_worker_group_start(self, worker_group_context: Any) -> None:
        self._note("group_start", num_workers=getattr(worker_group_context, "num_workers", None))

    def after_worker_group_start(self, worker_group: Any) -> None:
        self._note("group_ready")

    def after_worker_group_training_start(self, worker_group: Any) -> None:
        self._note("training_started")
