"""The multi-node tests' cluster: a ray.cluster_utils.Cluster of a head and one worker node, 1 CPU each."""

from __future__ import annotations

import pytest


@pytest.fixture
def cluster(monkeypatch):
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setenv("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "0.5")
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, logging_level="ERROR")
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()
