"""Retention holds across restarts (issue 51 item 1): after workers are killed mid-run, the run's storage holds
only the checkpoints Ray Train's retention keeps (``checkpoint.keep`` best by ``checkpoint.score``, plus the
latest), none that a failed worker group left behind: a checkpoint whose report the controller never collected
(complete on storage, resumed from, never registered, so never deleted) or whose upload a failure cut short.

Seen before the fix: a 2-worker run, keep=2, three workers killed, ended with 8 checkpoints. Here on the moto S3
server (the local path is checked on tests/distributed/test_train.py's three-fault run): a checkpoint every 2
steps and rank 1 killed one step after three of them, while their uploads and reports are in flight."""

from __future__ import annotations

import json

import pytest

from tests.distributed.conftest import run_job

pytestmark = pytest.mark.distributed

SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train's record of the checkpoints it holds


def held_by_ray_train(snapshot: dict) -> set[str]:
    """The checkpoint folders Ray Train's manager holds, from its snapshot in the run's folder."""
    results = [*snapshot["checkpoint_results"], snapshot.get("latest_checkpoint_result") or {}]
    return {r["checkpoint_dir_name"] for r in results if r}


def assert_only_retained(folders: set[str], snapshot: dict, keep: int, final: str) -> None:
    assert folders == held_by_ray_train(snapshot), (sorted(folders), sorted(held_by_ray_train(snapshot)))
    assert final in folders and len(folders) <= keep + 1, sorted(folders)  # the best `keep`, plus the latest


def test_three_killed_workers_leave_only_what_retention_keeps_on_s3(ray_session, home, s3_server, s3_bucket,
                                                                     tmp_path, monkeypatch):
    markers = tmp_path / "faults"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"step=5,rank=1; step=9,rank=1; step=15,rank=1; markers={markers}")
    summary = run_job(home, "keep-s3", f"checkpoint.storage_path=s3://{s3_bucket}/runs", "checkpoint.every_steps=2",
                      "checkpoint.keep=2", "failure.max_failures=5", "failure.spare_workers=0")
    assert summary["status"] == "FINISHED" and summary["restarts"] == 3 and len(list(markers.glob("fault-*"))) == 3
    client, prefix = s3_server.client(), "runs/keep-s3/"
    listed = client.list_objects_v2(Bucket=s3_bucket, Prefix=prefix, Delimiter="/")
    folders = {p["Prefix"][len(prefix):].rstrip("/") for p in listed.get("CommonPrefixes", [])}
    snapshot = json.loads(client.get_object(Bucket=s3_bucket, Key=prefix + SNAPSHOT)["Body"].read())
    assert_only_retained({f for f in folders if f.startswith("checkpoint_")}, snapshot, keep=2,
                         final=summary["checkpoint"].rstrip("/").rsplit("/", 1)[-1])
