"""Elastic training on a real multi-node cluster (ray.cluster_utils.Cluster): preemption, shrink, grow.

One scenario, because each phase needs the previous one: 2 workers on 2 nodes; the second node is drained
for preemption (a just-in-time checkpoint is taken), then removed (training continues on 1 worker from the
last checkpoint), then a new node joins (the run grows back to 2) and the run completes. Every epoch must
have consumed every training sample exactly once.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import tiny

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

STEPS_PER_EPOCH = 1438 // 32
EPOCHS = 12


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    """Poll until ``predicate()`` is truthy (a condition, not a fixed sleep); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def read_trace(prefix: Path) -> list[dict]:
    records = []
    for f in prefix.parent.glob(prefix.name + ".rank*"):
        for line in f.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def start_elastic_run(name: str, storage: str, trace: Path, summary_path: Path, *extra: str) -> tuple:
    """``jobs.train`` in a thread on the cluster: digits, ``scaling.num_workers=[1,2]``, a checkpoint every 10
    steps in ``storage``. Returns ``(thread, result)``; ``result["rc"]`` is the exit code once it ends."""
    from jobs import train

    argv = ["--config", "configs/digits.yaml",
            *tiny("scaling.num_workers=[1,2]", "scaling.resize_check_interval_s=1", "failure.worker_start_timeout_s=15",
                  "checkpoint.every_steps=10", f"checkpoint.storage_path={storage}", f"data.trace_path={trace}",
                  f"name={name}", *extra),
            "--summary-json", str(summary_path)]
    result: dict = {}
    driver = threading.Thread(target=lambda: result.setdefault("rc", train.main(argv)), daemon=True)
    driver.start()
    return driver, result


def drain_for_preemption(address: str, node_id: str, deadline_s: int) -> None:
    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=address)
    accepted, message = gcs.drain_node(
        node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"), "spot reclaim (test)",
        int(time.time() * 1000) + deadline_s * 1000,
    )
    assert accepted, message


def test_preempt_shrink_grow_and_see_every_sample_once(cluster, home, monkeypatch):
    trace = home / "trace"
    summary_path = home / "summary.json"
    storage = home / "store"
    # Stretch the run (0.1 s per step) while nodes come and go: Ray's autoscaling coordinator sees cluster
    # changes on a 20 s tick, so shrinking and growing each take up to ~30 s. Once it has grown back, the rest of
    # the run goes at full speed (the fault's delay_until: the file below).
    fast = home / "fast"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"delay=0.1,delay_until={fast}")
    driver, result = start_elastic_run("elastic", str(storage), trace, summary_path,
                                       f"train.epochs={EPOCHS}", "train.global_batch_size=32")

    doomed = cluster.list_all_nodes()[1]
    # phase 1: two workers are training and a checkpoint exists
    wait_for(lambda: any(r["world_size"] == 2 for r in read_trace(trace)), 120, "2-worker training")
    wait_for(lambda: list(storage.glob("elastic/checkpoint_*/meta.json")), 60, "a first checkpoint")
    # phase 2: the node is drained for preemption -> a just-in-time checkpoint
    drain_for_preemption(cluster.address, doomed.node_id, deadline_s=60)
    jit = wait_for(lambda: [m.parent.name for m in storage.glob("elastic/checkpoint_*/meta.json")
                            if json.loads(m.read_text()).get("reason") == "preemption"], 60, "a preemption checkpoint")
    snapshot = storage / "elastic" / "checkpoint_manager_snapshot.json"
    wait_for(lambda: snapshot.exists() and jit[0] in snapshot.read_text(), 60,
             "Ray to commit the preemption checkpoint")
    # phase 3: the node goes away -> training continues on one worker
    cluster.remove_node(doomed)
    wait_for(lambda: any(r["world_size"] == 1 for r in read_trace(trace)), 120, "1-worker training")
    # phase 4: capacity returns -> the run grows back to two workers
    t_grow = time.time()
    cluster.add_node(num_cpus=1)
    wait_for(lambda: any(r["world_size"] == 2 and r["t"] > t_grow for r in read_trace(trace)), 240,
             "2-worker training again")
    fast.touch()  # what the test waited for is seen: the remaining steps go undelayed
    driver.join(timeout=400)
    assert not driver.is_alive(), "the run did not finish"
    assert result["rc"] == 0
    summary = json.loads(summary_path.read_text())
    assert summary["world_sizes"] == [2, 1, 2], summary["world_sizes"]
    assert summary["restarts"] >= 2 and summary["steps"] == EPOCHS * STEPS_PER_EPOCH
    restored = [json.loads(m.read_text()) for m in storage.glob("elastic/checkpoint_*/meta.json")]
    assert restored and all(m["progress"]["global_step"] <= summary["steps"] for m in restored)
    assert_every_epoch_saw_each_sample_once(read_trace(trace), n_train=1438, g=32)


def assert_every_epoch_saw_each_sample_once(records: list[dict], n_train: int, g: int) -> None:
    """Each (epoch, step) was served whole by one world size; steps of an epoch are disjoint and complete."""
    by_step: dict[tuple[int, int], dict[int, dict[int, list[int]]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        by_step[(r["epoch"], r["step"])][r["world_size"]][r["rank"]] = r["ids"]
    epochs = {e for e, _ in by_step}
    assert epochs == set(range(EPOCHS))
    for epoch in epochs:
        seen: list[int] = []
        for step in range(n_train // g):
            groups = by_step[(epoch, step)]
            complete = [ranks for w, ranks in groups.items() if sorted(ranks) == list(range(w))]
            assert complete, f"epoch {epoch} step {step} was never served by a whole worker group"
            ids = [i for ranks in complete[:1] for part in ranks.values() for i in part]
            assert len(ids) == len(set(ids)) == g
            for ranks in complete[1:]:  # a recomputed step must consume exactly the same samples
                assert sorted(i for part in ranks.values() for i in part) == sorted(ids)
            seen.extend(ids)
        assert len(seen) == len(set(seen)) == (n_train // g) * g, f"epoch {epoch} repeated or skipped samples"
