"""Checkpoints in storage after failures, on the moto S3 server behind a slow link (issue 51 items 1 and 11).

**Retention holds across restarts.** Storage holds only the checkpoints Ray Train's retention keeps
(``checkpoint.keep`` best by ``checkpoint.score``, plus the latest), none that a failed worker group left behind: a
checkpoint whose report the controller never collected (complete, resumed from, never registered, so never
deleted: a 2-worker run with keep=2 and three killed workers ended with 8) or whose upload a failure cut short.
The same is checked on a local path on tests/distributed/test_train.py's three-fault run.

**Uploads do not fall behind training.** At most one upload is in flight (the next checkpoint waits for it:
elastic_train/train/uploads.py), so a failure loses at most one interval plus one upload, the end of the run waits
for one upload, and the summary says how far behind durable storage the run was at its worst. Before: all 22
steps trained in a couple of seconds while the uploads queued; the end of the run waited 13.7 s for the queue and
a worker killed at step 15 cost the run every step (it resumed from the start).

The link (tests/helpers/s3.py ``SlowLink``) carries 2 MB/s upstream, so rank 0's ~1 MB checkpoint takes about
half a second; a checkpoint every 2 steps of ~10 ms; rank 1 killed three times, one step after a checkpoint."""

from __future__ import annotations

import json

import pytest

from tests.distributed.conftest import run_job
from tests.helpers.s3 import SlowLink

pytestmark = pytest.mark.distributed

SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of the checkpoints it holds
EVERY, KILLS, LINK_BYTES_PER_S = 2, (5, 9, 15), 2_000_000


def held_by_ray_train(snapshot: dict) -> set[str]:
    """The checkpoint folders Ray Train's manager holds, from its snapshot in the run's folder."""
    results = [*snapshot["checkpoint_results"], snapshot.get("latest_checkpoint_result") or {}]
    return {r["checkpoint_dir_name"] for r in results if r}


def assert_only_retained(folders: set[str], snapshot: dict, keep: int, final: str) -> None:
    assert folders == held_by_ray_train(snapshot), (sorted(folders), sorted(held_by_ray_train(snapshot)))
    assert final in folders and len(folders) <= keep + 1, sorted(folders)  # the best `keep`, plus the latest


def test_killed_workers_on_a_slow_s3_link_lose_one_interval_and_leave_what_retention_keeps(
        ray_session, home, s3_server, s3_bucket, tmp_path, monkeypatch):
    link = SlowLink(s3_server.endpoint, LINK_BYTES_PER_S)
    monkeypatch.setenv("AWS_ENDPOINT_URL", link.endpoint)  # the driver's environment: Ray gets its filesystem
    markers = tmp_path / "markers"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", "; ".join(f"step={k},rank=1" for k in KILLS) + f"; markers={markers}")
    try:
        summary = run_job(home, "keep-s3", f"checkpoint.storage_path=s3://{s3_bucket}/runs",
                          f"checkpoint.every_steps={EVERY}", "checkpoint.keep=2", "failure.max_failures=5",
                          "failure.spare_workers=0")
    finally:
        link.close()
    assert summary["status"] == "FINISHED" and summary["restarts"] == len(KILLS)

    # retention: the bucket holds what Ray Train's retention keeps, nothing else
    client, prefix = s3_server.client(), "runs/keep-s3/"
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix=prefix, Delimiter="/")
    folders = {p["Prefix"][len(prefix):].rstrip("/") for p in listed.get("CommonPrefixes", [])}
    snapshot = json.loads(client.get_object(Bucket=s3_bucket, Key=prefix + SNAPSHOT)["Body"].read())
    assert_only_retained({f for f in folders if f.startswith("checkpoint_")}, snapshot, keep=2,
                         final=summary["checkpoint"].rstrip("/").rsplit("/", 1)[-1])

    # uploads: slower than the interval, yet one deep
    behind = summary["behind_storage"]
    assert behind["upload_s_mean"] > 0.2, behind  # vs steps of milliseconds: the link is the bottleneck
    assert summary["teardown"]["workers stop"] < behind["upload_s_mean"] + 3.0, (summary["teardown"], behind)
    assert behind["worst_steps"] <= 2 * EVERY, behind  # one interval past the upload in flight, at worst
    faults = sorted((json.loads(p.read_text()) for p in markers.glob("fault-*.json")), key=lambda f: f["unix"])
    phases = [json.loads(line) for line in (markers / "phases.rank0.jsonl").read_text().splitlines()]
    restored = sorted((r for r in phases if r["event"] == "restored"), key=lambda r: r["unix"])
    assert [f["step"] for f in faults] == list(KILLS), faults
    for f in faults:  # each failure lost at most one interval plus the one upload in flight
        resumed = next(r["step"] for r in restored if r["unix"] > f["unix"])
        assert f["step"] - resumed <= 2 * EVERY, (f, restored)
