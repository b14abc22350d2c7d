"""RunLedger: a small actor that remembers a run's goodput book across worker-group restarts.

Created by the driver (one per ``fit()``, or one per sweep that its trials share, each ``fit`` under its own
key: an actor fewer to start per trial), handed to the workers; rank 0 writes to it fire-and-forget at
log cadence and reads it back after a restart. It holds no training state: losing it only loses the
accounting of the current driver's lifetime, never data.
"""

from __future__ import annotations

from typing import Any

import ray


@ray.remote(num_cpus=0, max_restarts=0)
class RunLedger:
    """Books by key: one per ``fit`` (a sweep's trials share one ledger, each fit under a key of its own)."""

    def __init__(self) -> None:
        self._books: dict[str, dict[str, Any]] = {}
        self._finals: dict[str, dict[str, Any]] = {}

    def put(self, book: dict[str, Any], key: str = "") -> None:
        self._books[key] = book

    def get(self, key: str = "") -> dict[str, Any] | None:
        return self._books.get(key)

    def put_final(self, final: dict[str, Any], key: str = "") -> None:
        self._finals[key] = final

    def get_final(self, key: str = "") -> dict[str, Any] | None:
        return self._finals.get(key)

    def drop(self, key: str) -> None:
        self._books.pop(key, None)
        self._finals.pop(key, None)


def create_ledger() -> Any:
    """A ledger pinned to the driver's node, like Ray Train's controller: it must outlive worker nodes."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return RunLedger.options(scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote()
