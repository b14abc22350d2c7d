"""The fault campaign on separate hosts, short: ``bench/chaos.py --hosts --smoke`` (6 faults over 3 epochs) on a
``cluster.sim`` cluster of its own (bridge ``etchaos1``, 198.18.6.0/24: apart from this folder's other tests and a
user's default sim). Seed 3 over ``exit,host,partition`` draws every one of them at least once: a worker host's
processes all SIGKILLed at once (the host joins again 3 steps later), a worker host's link down for 10-20 s (then
healed, its leftovers killed, the host joined again), and workers that exit.

The end checks are bench/chaos.py's (``passed``): the run finished, every fault fired, every epoch consumed every
sample exactly once, the train loss within 1e-4 relative of the fault-free run on the same hosts, one MLflow run
FINISHED with every step's metrics once and ``restarts`` right, goodput parts that sum to the wall; and a
detection time for every host and partition fault (the Train controller's failure decision after the fault).
"""

from __future__ import annotations

import json

import pytest

from cluster import sim as simulator

# the 20-fault run: ~8 min here
pytestmark = [pytest.mark.hosts, pytest.mark.long, pytest.mark.soak, pytest.mark.timeout(2400)]


def test_the_hosts_campaign_smoke_survives_host_loss_and_partitions(capsys):
    why = simulator.namespaces_supported()
    if why is not None:
        pytest.skip(f"separate hosts need network namespaces: {why}")
    from bench.chaos import main

    rc = main(["--hosts", "--smoke", "--seed", "3", "--kinds", "exit,host,partition", "--bridge", "etchaos1",
               "--subnet", "198.18.6"])
    report = json.loads(capsys.readouterr().out)
    assert report["problems"] == [] and rc == 0, report["problems"]
    t = report["totals"]
    assert t["injected"] == t["scheduled"] == 6 and t["survived"] == 6 and t["samples_lost"] == 0
    assert {"exit", "host", "partition"} <= set(t["kinds"])
    for row in report["faults"]:
        if row["kind"] in ("host", "partition"):
            bound = 15 if row["kind"] == "partition" else 30  # start-head.sh: a silent node is dead after ~10 s
            assert row["detection_s"] is not None and row["detection_s"] <= bound, row
            assert row.get("recovery_s") is not None, row


def test_the_hosts_campaign_with_head_loss_survives_20_faults(capsys):
    """The campaign on hosts drawn from every kind, ``head`` included (seed 4: two head losses, a host loss, a
    partition, two driver kills and 14 worker faults over 8 epochs), on a sim with GCS fault tolerance (a real
    Redis): every fault survived, no sample lost or repeated, one MLflow run; each head loss's phases measured."""
    why = simulator.namespaces_supported()
    if why is not None:
        pytest.skip(f"separate hosts need network namespaces: {why}")
    from bench.chaos import main

    rc = main(["--hosts", "--seed", "4", "--bridge", "etchaos2", "--subnet", "198.18.7"])
    report = json.loads(capsys.readouterr().out)
    assert report["problems"] == [] and rc == 0, report["problems"]
    t = report["totals"]
    assert t["injected"] == t["scheduled"] >= 20 and t["survived"] == t["injected"] and t["samples_lost"] == 0
    heads = [row for row in report["faults"] if row["kind"] == "head"]
    assert heads and all(row["fired"] for row in heads)
    for row in heads:  # the job client ends at once; the worker hosts are back with the new head (the same nodes)
        assert row["detection_s"] is not None and row["detection_s"] < 10, row
        assert row["workers_back_s"] is not None and row["workers_back_s"] - row["head_back_s"] < 30, row
    # a head loss's recovery (kill -> the first step of the new driver) is measured unless another fault fired first
    assert any(row.get("recovery_s") is not None for row in heads), heads
