"""Storage that fails mid-run: the S3 endpoint goes away for a few seconds exactly while a checkpoint uploads
(tests/helpers/s3.py OutageGate: connections refused and reset, then back on the same port). The run rides it
out without a restart (run storage retries each request, data/filesystems.py), finishes, and its latest
checkpoint is whole and loads."""

from __future__ import annotations

import pyarrow.fs
import pytest
import torch

from elastic_train.data import filesystems
from elastic_train.train.state import load_model, read_meta
from tests.distributed.conftest import run_job
from tests.helpers.s3 import OutageGate

pytestmark = pytest.mark.distributed

OUTAGE_S = 4.0


def test_an_s3_outage_during_a_checkpoint_upload_is_ridden_out(ray_session, home, s3_server, s3_bucket,
                                                                tmp_path, monkeypatch):
    gate = OutageGate(s3_server.endpoint, trip_on=b"/checkpoint_000000006/", outage_s=OUTAGE_S)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gate.endpoint)  # the driver's environment: Ray gets its filesystem
    try:
        summary = run_job(home, "s3-outage", f"checkpoint.storage_path=s3://{s3_bucket}/runs",
                          "checkpoint.every_steps=3", "checkpoint.keep=10", "train.epochs=1")  # keep all
    finally:
        gate.close()
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)  # read the bucket past the gate
    assert gate.tripped_at is not None, "no request touched checkpoint_000000006: the outage never happened"
    assert gate.reopened_at is not None and gate.reset_connections >= 1
    assert summary["status"] == "FINISHED"
    assert summary["restarts"] == 0  # ridden out by the retries, not by a restart

    # the checkpoint the outage hit, and the latest one, are whole: every file, meta.json among them
    prefix = f"{s3_bucket}/runs/s3-outage"
    fs, _ = filesystems.resolve(f"s3://{prefix}")
    for name in ("checkpoint_000000006", summary["checkpoint"].rstrip("/").rsplit("/", 1)[-1]):
        local = tmp_path / name
        pyarrow.fs.copy_files(f"{prefix}/{name}", str(local), source_filesystem=fs,
                              destination_filesystem=pyarrow.fs.LocalFileSystem())
        meta = read_meta(local)
        assert {"model.pt", "train_state.pt", "meta.json"} <= {p.name for p in local.iterdir()}
        model, _, _ = load_model(local)
        assert all(torch.isfinite(p).all() for p in model.parameters())
        torch.load(local / "train_state.pt", weights_only=False)  # not truncated
    assert meta["progress"]["epoch"] == 1
