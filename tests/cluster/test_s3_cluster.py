"""A 2-node ray.cluster_utils.Cluster whose run storage is the S3 bucket, not a path shared by the nodes: the
second node is removed mid-run, training continues on one worker from the last checkpoint in the bucket, and
every epoch still consumed every training sample exactly once. Nothing lands on local disk."""

from __future__ import annotations

import json

import pytest

from tests.cluster.test_elastic import start_elastic_run, wait_for
from tests.helpers.trace import exactly_once_problems, read_trace

# ~1-2 minutes loaded: Ray's autoscaling coordinator sees the lost node on a 20 s tick before the run shrinks
pytestmark = [pytest.mark.cluster, pytest.mark.long]

EPOCHS, G, N_TRAIN = 3, 32, 1438


def test_a_node_removed_from_a_cluster_storing_in_s3(cluster, home, s3_server, s3_bucket, monkeypatch):
    trace, summary_path = home / "trace", home / "summary.json"
    client = s3_server.client()

    def committed() -> list[str]:  # checkpoints Ray's snapshot in the bucket lists
        try:
            body = client.get_object(Bucket=s3_bucket, Key="runs/s3-cluster/checkpoint_manager_snapshot.json")
        except client.exceptions.NoSuchKey:
            return []
        return [n for n in json.loads(body["Body"].read()).get("checkpoint_results", []) if n]

    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", "delay=0.1")  # stretch the run while the node goes
    driver, result = start_elastic_run("s3-cluster", f"s3://{s3_bucket}/runs", trace, summary_path,
                                       f"train.epochs={EPOCHS}", f"train.global_batch_size={G}")

    doomed = cluster.list_all_nodes()[1]
    wait_for(lambda: any(r["world_size"] == 2 for r in read_trace(trace)), 120, "2-worker training")
    wait_for(committed, 60, "a checkpoint committed in the bucket")
    cluster.remove_node(doomed)  # no drain: the node and its worker are gone
    driver.join(timeout=400)
    assert not driver.is_alive(), "the run did not finish"
    assert result["rc"] == 0
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "FINISHED"
    assert summary["world_sizes"][0] == 2 and summary["world_sizes"][-1] == 1, summary["world_sizes"]
    assert summary["restarts"] >= 1 and summary["steps"] == EPOCHS * (N_TRAIN // G)
    assert summary["checkpoint"].startswith(f"s3://{s3_bucket}/runs/s3-cluster/checkpoint_")
    assert not list(home.glob("**/checkpoint_*")), "a checkpoint landed on local disk"
    assert exactly_once_problems(read_trace(trace), N_TRAIN, G, EPOCHS) == []
