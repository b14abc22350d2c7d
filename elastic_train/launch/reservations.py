"""Release what a dead driver's Ray Train run still reserves, before the run resumed by name asks for workers.

Ray Train's elastic scaling asks a detached, cluster-wide ``AutoscalingCoordinator`` actor for its workers'
resources (requester ``train-<Train run id>``, expiring after 180 s) and starts only as many workers as the
coordinator reserves for it. A SIGKILLed driver never cancels its request, so the same run resumed by name
found the cluster's CPUs reserved for the dead run and waited out the 180 s before training (bench/chaos.py:
a driver-kill recovery of 198-221 s, ~180 s of it this wait). The workers write their Train run id into every
checkpoint's meta.json (``ray_train_run_id``); before ``fit`` the driver cancels that run's request. Best
effort and bounded (a private Ray actor): any failure leaves Ray's own expiry in charge.

**Any dead controller's request, whoever left it.** The same leftover comes from every Train controller that
dies without running its own end: a driver killed before its first checkpoint, a sweep's trial paused by PBT or
failing, a killed sweep. An elastic run started within 180 s (the next trial, the resumed sweep, another job on
the cluster) could not grow into those workers. So every controller of ours records itself at its start, in the
GCS's key-value store (``<controller actor id>/<Train run id>``, :class:`~elastic_train.launch.controller.
RecordTrainRun`), and :func:`release_dead_runs_requests` cancels the requests of every recorded controller the
GCS no longer holds alive, and drops its record: each fit before it asks for workers, and a sweep's driver every
couple of seconds (sweep/placement_groups.py). A dead controller can use nothing it reserved, so this is always
safe.
"""

from __future__ import annotations

from elastic_train import runlog

TIMEOUT_S = 5.0
RUNS_NAMESPACE = b"elastic_train_train_runs"


def release_stale_reservation(ray_train_run_id: str | None) -> bool:
    """Cancel the coordinator request of the Train run ``ray_train_run_id`` (a checkpoint's, for a controller that
    predates the records below); whether the call went out."""
    if not ray_train_run_id:
        return False
    import ray

    from elastic_train.compat.ray_train import cancel_resource_requests, train_run_requester

    try:
        ray.get(cancel_resource_requests([train_run_requester(ray_train_run_id)]), timeout=TIMEOUT_S)
        return True
    except Exception as e:  # best effort: Ray's own 180 s expiry still applies
        runlog.dropped(f"cancelling the dead Train run {ray_train_run_id}'s resource request (Ray's 180 s expiry "
                       "applies: the run may wait for its workers up to that long)", e)
        return False


def record_train_run(controller_actor_id: str, ray_train_run_id: str) -> None:
    """Note a live controller and its Train run (the controller, at its start). Raises on a GCS that does not
    answer in time."""
    from elastic_train.compat.ray_core import kv_put

    kv_put(f"{controller_actor_id}/{ray_train_run_id}".encode(), b"", RUNS_NAMESPACE, TIMEOUT_S)


def release_dead_runs_requests() -> list[str]:
    """Cancel the coordinator requests of every recorded Train run whose controller is no longer alive, and drop
    their records; returns those runs' ids. Each record's controller is looked up on its own (its GCS record),
    so a check costs what is recorded, not the GCS's whole actor table. Best effort and bounded: any failure
    leaves Ray's expiry in charge, and says so once."""
    import ray

    from elastic_train.compat.ray_core import actor_alive, kv_delete_prefix, kv_keys
    from elastic_train.compat.ray_train import cancel_resource_requests, train_run_requester

    try:
        recorded = [key.decode().split("/", 1) for key in kv_keys(b"", RUNS_NAMESPACE, TIMEOUT_S)]
        dead = [(actor, run) for actor, run in recorded if not actor_alive(actor)]
        if dead:
            # waited for: the fit about to start asks from its own controller, whose calls are not ordered after ours
            ray.get(cancel_resource_requests([train_run_requester(run) for _, run in dead]), timeout=TIMEOUT_S)
            for actor, run in dead:
                kv_delete_prefix(f"{actor}/{run}".encode(), RUNS_NAMESPACE, TIMEOUT_S)
        return [run for _, run in dead]
    except Exception as e:  # best effort (a sweep's driver calls this every 2 s: said once per run)
        runlog.dropped("cancelling dead Train runs' resource requests (Ray's 180 s expiry applies to them)", e,
                       once="release_dead_runs_requests")
        return []
