"""RunResources: everything a run is handed that is not its config, as one value.

Built once per fit (``jobs.train``: ``fit(ctx)``; a sweep trial: ``fit(ctx, RunResources(...))`` with the sweep's
shared dataset and relay), completed by ``fit`` (the ledger, the log floor, the dataset reference), and passed whole to
``build_trainer`` and, less its driver-only fields, to every worker (``WorkerArgs.resources``). A new per-run value
is one field here and its use; nothing in between changes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class RunResources:
    data_ref: Any | None = None  # the dataset in the object store (a sweep's, put once for every trial)
    ledger: Any | None = None  # this fit's RunLedger (train/ledger.py): set by fit, a fresh key per fit
    tracking_relay: Any | None = None  # a sweep's MLflow relay actor (tracking/relay.py); None: rank 0's own sender
    log_floor: int = -1  # metrics at steps <= this were logged by an earlier driver (a resume): skipped
    start_from: str | None = None  # another run's checkpoint to continue while this run has none (a PBT clone)
    run_folder: str | None = None  # the run's local folder: its log file (elastic_train/runlog.py), on every node
    # The driver's side only (never sent to workers):
    callbacks: tuple[Any, ...] = ()  # Ray Train callbacks beyond the engine's own (Tune's report callback)
    scaling_policy: Any | None = None  # ScalingConfig -> Ray Train scaling policy, instead of Ray's (elastic trial)
    # Whether the caller removes the run's placement group when its controller dies (a sweep's reaper,
    # sweep/placement_groups.py): then the run starts no Ray PlacementGroupCleaner (launch/controller.py). A sweep
    # says either way; None (a run of its own): reaped when its Ray is embedded (one node, which ends with the run).
    placement_groups_reaped: bool | None = None

    def for_workers(self) -> RunResources:
        """What every worker gets: the driver-only fields left out."""
        return replace(self, callbacks=(), scaling_policy=None)
