"""An `mlflow server` whose artifacts live in an S3 bucket (the real S3 API of tests/helpers/s3.py): what a run
logs (checkpoint folders, models: artifacts) lands in the bucket; the run's dataset input is recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.cluster.test_elastic import wait_for
from tests.conftest import ROOT
from tests.e2e.conftest import free_ports

pytestmark = pytest.mark.e2e


@pytest.fixture
def s3_mlflow_server(s3_bucket, tmp_path):
    port = free_ports(1)[0]
    uri = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "ab")  # closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracking.server", "--port", str(port), "--home", str(tmp_path / "mlflow"),
         "--workers", "1", "--artifacts-destination", f"s3://{s3_bucket}/mlartifacts"],
        cwd=ROOT, env=dict(os.environ), stdout=log, stderr=log, start_new_session=True,
    )

    def healthy() -> bool:
        assert proc.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, 180, f"mlflow server on {uri}", poll=0.3)
        yield uri
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_run_artifacts_land_in_the_bucket(s3_server, s3_bucket, s3_mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    from tracking.mlflow_backend import MlflowBackend

    backend = MlflowBackend(s3_mlflow_server, tmp_path)
    spec, _ = backend.start_run("elastic-train", "s3-artifacts", kind="train", spool_path=tmp_path / "spool.jsonl")
    ckpt = tmp_path / "checkpoint_000000005"
    ckpt.mkdir()
    (ckpt / "meta.json").write_text('{"step": 5}')
    backend.log_artifacts(spec, ckpt, "checkpoints/checkpoint_000000005")
    backend.log_dataset(spec, {"name": "ray:parquet", "uri": f"s3://{s3_bucket}/digits", "digest": "d1",
                               "schema": {"x": "float[64]"}, "num_rows": 1797, "profile": {}})
    backend.end_run(spec, "FINISHED")

    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket, Prefix="mlartifacts/")["Contents"]]
    assert any(k.endswith("checkpoints/checkpoint_000000005/meta.json") for k in keys), keys
    run = MlflowClient(s3_mlflow_server).get_run(spec.run_id)
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["ray:parquet"]
    assert s3_server.secret_key not in str(run.data.params) + str(run.data.tags)
