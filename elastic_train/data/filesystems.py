"""One filesystem for a path or URI (local, NFS, ``s3://``, ``gs://``), with bounded waits. pyarrow only.

``s3://`` follows the standard AWS environment: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (an S3-compatible
server such as MinIO, Ceph or moto), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, and the credential chain. When the
driver's environment holds explicit keys they are put in the filesystem object, so Ray workers started before
those variables were set (or on nodes without them) use the same identity; nothing here logs or returns a key.
Every request is bounded: a connect timeout, a request timeout and a small retry budget, so an unreachable
endpoint fails in seconds instead of the SDK's minutes (DESIGN invariant 10).

Run storage (checkpoints, Ray Train's snapshot) gets a larger, still bounded budget: :class:`DurableS3FileSystem`
retries every request for about 25 s (``STORAGE_MAX_ATTEMPTS``, 25 ms doubling), so a store that is away for a
few seconds mid-run is ridden out by each storage call Ray Train makes, on the driver, the controller and every
worker (docs/faults.md, "Storage that fails mid-run").
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs

CONNECT_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 20.0
MAX_ATTEMPTS = 3
STORAGE_MAX_ATTEMPTS = 10  # AwsDefaultS3RetryStrategy, 25 ms doubling: ~25 s of waits, then the error


def is_uri(path: str) -> bool:
    return "://" in path


def s3_filesystem(*, connect_timeout_s: float = CONNECT_TIMEOUT_S, request_timeout_s: float = REQUEST_TIMEOUT_S,
                  max_attempts: int = MAX_ATTEMPTS) -> pyarrow.fs.S3FileSystem:
    """An S3 filesystem from the standard AWS environment, every wait bounded."""
    return pyarrow.fs.S3FileSystem(  # type: ignore[arg-type]
        **_s3_options(connect_timeout_s, request_timeout_s),
        retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=max_attempts),
    )


class DurableS3FileSystem(pyarrow.fs.S3FileSystem):
    """S3 for run storage: every request retried ``max_attempts`` times with deterministic exponential backoff
    (25 ms doubling; 10 attempts wait about 25 s in all), then the error.

    pyarrow's own pickling of an S3FileSystem drops its retry strategy, and Ray ships the storage filesystem to
    its controller and to every worker: this class pickles with it.
    """

    def __init__(self, options: dict[str, object], max_attempts: int = STORAGE_MAX_ATTEMPTS):
        super().__init__(**options, retry_strategy=pyarrow.fs.AwsDefaultS3RetryStrategy(max_attempts=max_attempts))
        self._options, self._max_attempts = options, max_attempts

    def __reduce__(self):  # pickle protocol
        return DurableS3FileSystem, (self._options, self._max_attempts)


def storage_filesystem(max_attempts: int = STORAGE_MAX_ATTEMPTS) -> DurableS3FileSystem:
    """The S3 filesystem for a run's storage (see :class:`DurableS3FileSystem`)."""
    return DurableS3FileSystem(_s3_options(CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S), max_attempts)


def _s3_options(connect_timeout_s: float, request_timeout_s: float) -> dict[str, object]:
    env = os.environ
    kwargs: dict[str, object] = {"connect_timeout": connect_timeout_s, "request_timeout": request_timeout_s}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        kwargs["endpoint_override"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        kwargs["region"] = region
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        kwargs["access_key"] = env["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            kwargs["session_token"] = env["AWS_SESSION_TOKEN"]
    return kwargs


def resolve(path: str, *, durable: bool = False) -> tuple[pyarrow.fs.FileSystem, str]:
    """``(filesystem, path inside it)`` for a local path or a URI; ``s3://bucket/key`` -> ``bucket/key``.
    ``durable``: run storage, whose requests ride out a short outage (:class:`DurableS3FileSystem`)."""
    if path.startswith("s3://"):
        return (storage_filesystem() if durable else s3_filesystem()), path[len("s3://"):].rstrip("/")
    if is_uri(path):
        return pyarrow.fs.FileSystem.from_uri(path)
    return pyarrow.fs.LocalFileSystem(), str(Path(path).expanduser().resolve())


def explain(error: BaseException) -> str:
    """A short reason for a storage error, free of credentials (pyarrow's messages hold none)."""
    text = str(error)
    low = text.lower()
    if "access_denied" in low or "accessdenied" in low or "signature" in low or "invalidaccesskeyid" in low:
        return f"access denied: check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) ({text})"
    if "curl" in low or "connect" in low or "network" in low or "timed out" in low or "timeout" in low:
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or "AWS default"
        return f"endpoint unreachable ({endpoint}): {text}"
    return f"{type(error).__name__}: {text}"


def check_bucket(fs: pyarrow.fs.FileSystem, path: str, uri: str) -> str | None:
    """For object stores: ``None`` if the bucket of ``path`` exists, else why it is unusable."""
    if not uri.startswith(("s3://", "gs://")):
        return None
    bucket = path.split("/", 1)[0]
    info = fs.get_file_info(bucket)
    if info.type == pyarrow.fs.FileType.NotFound:
        return f"bucket {bucket!r} does not exist"
    return None
