"""Ray Data from s3:// with checkpoints in the bucket, through a killed worker: exactly once per epoch by sample
id, checkpoints in the bucket (not on local disk), the secret key nowhere in the summary, console or MLflow run."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from elastic_train.data.spec import split_indices
from tests.distributed.conftest import run_job
from tests.helpers.ray_data import write_digits_parquet

pytestmark = pytest.mark.distributed

EPOCHS, G, SEED = 1, 128, 0  # one epoch of 11 steps: the fault at step 6, checkpoints every 3


def read_trace(prefix: Path) -> list[dict]:
    return [json.loads(line) for f in prefix.parent.glob(prefix.name + ".rank*")
            for line in f.read_text().splitlines() if line.strip()]


def sample_ids_per_epoch(records: list[dict], train_ids: list[int]) -> dict[int, list[int]]:
    """The ids each epoch trained on, one whole worker group per step (a recomputed step must match the first)."""
    by_step: dict[tuple[int, int], dict[tuple[int, int], list[int]]] = defaultdict(dict)
    for r in records:
        by_step[(r["epoch"], r["step"])][(r["world_size"], r["rank"])] = [train_ids[i] for i in r["ids"]]
    seen: dict[int, list[int]] = defaultdict(list)
    for (epoch, _), parts in sorted(by_step.items()):
        servings = defaultdict(list)
        for (w, _rank), ids in sorted(parts.items()):
            servings[w].extend(ids)
        first, *again = servings.values()
        assert all(sorted(a) == sorted(first) for a in again)
        seen[epoch].extend(first)
    return seen


def test_ray_data_from_s3_with_s3_checkpoints_survives_a_killed_worker(
    ray_session, home, s3_server, s3_bucket, tmp_path, monkeypatch, capsys
):
    n = write_digits_parquet(f"s3://{s3_bucket}/digits", files=3)
    marker, trace = tmp_path / "fault-fired", tmp_path / "trace"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"step=6,rank=1,marker={marker},mode=exit")
    summary = run_job(
        home, "s3-ray", "data.name=ray", f"data.path=s3://{s3_bucket}/digits", "data.features=[x]",
        "data.feature_shape=[64]", "data.id_column=id", "data.preprocess=tests.helpers.ray_data:scale_pixels",
        f"checkpoint.storage_path=s3://{s3_bucket}/runs", "checkpoint.every_steps=3", f"data.trace_path={trace}",
        f"train.epochs={EPOCHS}",
    )
    console = capsys.readouterr()
    assert marker.exists(), "the fault never fired"
    assert f"data read from s3://{s3_bucket}/digits: 3 parquet file(s)" in console.out
    assert summary["restarts"] == 1 and summary["final_metrics"]["val_accuracy"] > 0.5

    # exactly once per epoch, by the Parquet's own sample ids (ids are 0..n-1: sorted id order = row index)
    train_ids = split_indices(n, 0.2, SEED)[0].tolist()
    seen = sample_ids_per_epoch(read_trace(trace), train_ids)
    assert sorted(seen) == list(range(EPOCHS))
    for ids in seen.values():
        assert len(ids) == len(set(ids)) == (len(train_ids) // G) * G
        assert set(ids) <= set(train_ids)

    # checkpoints are in the bucket, nothing on local disk
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="runs/s3-ray/")["Contents"]]
    assert any("/checkpoint_" in k and k.endswith("meta.json") for k in keys), keys
    assert summary["checkpoint"].startswith(f"s3://{s3_bucket}/runs/s3-ray/checkpoint_")
    assert not list(home.glob("s3-ray/checkpoint_*"))

    # the secret appears nowhere we write
    secret = s3_server.secret_key
    assert secret not in json.dumps(summary) and secret not in console.out and secret not in console.err
    import mlflow

    run = mlflow.MlflowClient(summary["tracking_uri"]).get_run(summary["mlflow_run_id"])
    assert secret not in json.dumps({**run.data.params, **run.data.tags})
