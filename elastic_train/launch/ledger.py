"""RunLedger: a small actor that remembers a run's goodput book across worker-group restarts.

Created by the driver (one per ``fit()``), handed to the workers; rank 0 writes to it fire-and-forget at
log cadence and reads it back after a restart. It holds no training state: losing it only loses the
accounting of the current driver's lifetime, never data.
"""

from __future__ import annotations

from typing import Any

import ray


@ray.remote(num_cpus=0, max_restarts=0)
class RunLedger:
    def __init__(self) -> None:
        self._book: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None

    def put(self, book: dict[str, Any]) -> None:
        self._book = book

    def get(self) -> dict[str, Any] | None:
        return self._book

    def put_final(self, final: dict[str, Any]) -> None:
        self._final = final

    def get_final(self) -> dict[str, Any] | None:
        return self._final


def create_ledger() -> Any:
    """A ledger pinned to the driver's node, like Ray Train's controller: it must outlive worker nodes."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return RunLedger.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
