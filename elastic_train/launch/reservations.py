"""Release what a dead driver's Ray Train run still reserves, before the run resumed by name asks for workers.

Ray Train's elastic scaling asks a detached, cluster-wide ``AutoscalingCoordinator`` actor for its workers'
resources (requester ``train-<Train run id>``, expiring after 180 s) and starts only as many workers as the
coordinator reserves for it. A SIGKILLed driver never cancels its request, so the same run resumed by name
found the cluster's CPUs reserved for the dead run and waited out the 180 s before training (bench/chaos.py:
a driver-kill recovery of 198-221 s, ~180 s of it this wait). The workers write their Train run id into every
checkpoint's meta.json (``ray_train_run_id``); before ``fit`` the driver cancels that run's request. Best
effort and bounded (a private Ray actor): any failure leaves Ray's own expiry in charge. Not covered: a driver
killed before its first checkpoint (the latest checkpoint then names an earlier, already finished run).
"""

from __future__ import annotations

TIMEOUT_S = 5.0


def release_stale_reservation(ray_train_run_id: str | None) -> bool:
    """Cancel the coordinator request of the Train run ``ray_train_run_id``; whether the call went through."""
    if not ray_train_run_id:
        return False
    import ray

    try:
        coordinator = ray.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")
        ray.get(coordinator.cancel_request.remote(requester_id=f"train-{ray_train_run_id}"), timeout=TIMEOUT_S)
        return True
    except Exception:  # best effort: Ray's own 180 s expiry still applies
        return False
