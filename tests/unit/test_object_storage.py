"""Object storage against a real S3 API (moto_server with IAM auth, tests/helpers/s3.py): the preflight refuses a
missing bucket, wrong credentials and an unreachable endpoint in seconds, naming checkpoint.storage_path, before
Ray is touched; a usable bucket passes and is left clean."""

from __future__ import annotations

import time

import pytest

from elastic_train.data import filesystems
from jobs import train
from tests.conftest import tiny
from tests.helpers.s3 import _free_port


def _train_exit(capsys, storage: str) -> tuple[int, str, float]:
    t0 = time.monotonic()
    argv = ["--config", "configs/digits.yaml", *tiny("name=s3-preflight", f"checkpoint.storage_path={storage}")]
    code = train.main(argv)
    return code, capsys.readouterr().err, time.monotonic() - t0


def test_missing_bucket_exits_2_naming_the_field(s3_bucket, home, capsys):
    code, err, took = _train_exit(capsys, "s3://no-such-bucket-here/runs")
    assert code == 2
    assert "checkpoint.storage_path" in err and "bucket 'no-such-bucket-here' does not exist" in err
    assert took < 15


def test_wrong_secret_exits_2_and_never_prints_a_secret(s3_server, s3_bucket, home, capsys, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-123")
    code, err, took = _train_exit(capsys, f"s3://{s3_bucket}/runs")
    assert code == 2
    assert "checkpoint.storage_path" in err and "access denied" in err
    assert "wrong-secret-123" not in err and s3_server.secret_key not in err
    assert took < 15


@pytest.mark.slow  # ~2 s: the bounded connect attempts
def test_unreachable_endpoint_exits_2_within_seconds(s3_bucket, home, capsys, monkeypatch):
    dead = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", dead)
    code, err, took = _train_exit(capsys, f"s3://{s3_bucket}/runs")
    assert code == 2
    assert "checkpoint.storage_path" in err and "unreachable" in err and dead in err
    assert took < 20


def test_usable_bucket_passes_and_is_left_clean(s3_server, s3_bucket):
    from elastic_train.launch.preflight import check_uri_storage

    check_uri_storage(f"s3://{s3_bucket}/runs/a")
    keys = [o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket).get("Contents", [])]
    assert not [k for k in keys if ".preflight-" in k], keys


def test_the_filesystem_follows_the_aws_environment(s3_server, s3_bucket):
    fs, path = filesystems.resolve(f"s3://{s3_bucket}/x/y.txt")
    assert path == f"{s3_bucket}/x/y.txt"
    with fs.open_output_stream(path) as f:
        f.write(b"hello")
    body = s3_server.client().get_object(Bucket=s3_bucket, Key="x/y.txt")["Body"].read()
    assert body == b"hello"


@pytest.mark.parametrize("path", ["relative/dir", "/abs/dir"])
def test_local_paths_resolve_to_absolute_local_paths(path):
    fs, p = filesystems.resolve(path)
    assert type(fs).__name__ == "LocalFileSystem" and p.startswith("/")


def _checkpoint_part(tmp_path) -> tuple[str, dict[str, bytes]]:
    files = {"model.pt": b"w" * 200_000, "train_state.pt": b"s" * 1000, "rng/rank_0.pt": b"r", "meta.json": b"{}"}
    for rel, body in files.items():
        (tmp_path / "part" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "part" / rel).write_bytes(body)
    return str(tmp_path / "part"), files


def _keys(s3_server, bucket: str, prefix: str) -> dict[str, bytes]:
    client = s3_server.client()
    objects = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix):]: client.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            for o in objects if not o["Key"].endswith("/")}  # not the folder markers


@pytest.mark.slow  # ~3 s: the outage
def test_run_storage_rides_out_a_short_outage_even_after_pickling(s3_server, s3_bucket, tmp_path, monkeypatch):
    """The server goes away for 2 s as a checkpoint uploads: Ray's copy of the storage filesystem (pickled, as
    Ray ships it to its controller and workers) retries through it and the whole part arrives."""
    import pickle

    from elastic_train.train.state import upload_checkpoint
    from tests.helpers.s3 import OutageGate

    gate = OutageGate(s3_server.endpoint, trip_on=b"/ckpt/model.pt", outage_s=2.0)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gate.endpoint)
    try:
        fs, _ = filesystems.resolve(f"s3://{s3_bucket}/ckpt", durable=True)
        fs = pickle.loads(pickle.dumps(fs))
        local, files = _checkpoint_part(tmp_path)
        upload_checkpoint(local, fs, f"{s3_bucket}/ckpt")
    finally:
        gate.close()
    assert gate.tripped_at is not None and gate.reopened_at is not None, "the outage never happened"
    assert _keys(s3_server, s3_bucket, "ckpt/") == files


def test_an_upload_cut_short_leaves_no_meta_json(s3_server, s3_bucket, tmp_path, monkeypatch):
    """A store that stays away past the retries: the part is incomplete (no meta.json), never half a checkpoint
    that says it is whole."""
    from elastic_train.train.state import upload_checkpoint
    from tests.helpers.s3 import OutageGate

    gate = OutageGate(s3_server.endpoint, trip_on=b"/ckpt/train_state.pt", outage_s=3600)
    monkeypatch.setenv("AWS_ENDPOINT_URL", gate.endpoint)
    try:
        local, files = _checkpoint_part(tmp_path)
        with pytest.raises(OSError, match="NETWORK_CONNECTION"):
            upload_checkpoint(local, filesystems.storage_filesystem(max_attempts=1), f"{s3_bucket}/ckpt")
    finally:
        gate.close()
    uploaded = _keys(s3_server, s3_bucket, "ckpt/")
    assert "train_state.pt" not in uploaded and "meta.json" not in uploaded


def test_upload_checkpoint_to_a_local_store_makes_its_folders(tmp_path):
    """The same upload into a local path (the default storage): nested folders (rng/) are created."""
    import pyarrow.fs

    from elastic_train.train.state import upload_checkpoint

    local, files = _checkpoint_part(tmp_path)
    upload_checkpoint(local, pyarrow.fs.LocalFileSystem(), str(tmp_path / "store" / "checkpoint_000000001"))
    got = {p.relative_to(tmp_path / "store" / "checkpoint_000000001").as_posix(): p.read_bytes()
           for p in (tmp_path / "store").rglob("*") if p.is_file()}
    assert got == files
