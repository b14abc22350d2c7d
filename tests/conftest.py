"""Shared fixtures: one local Ray per session, an isolated home (results + MLflow store) per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Faster failure detection and cheaper report() barriers for every trainer the tests build.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# The console filter a job exports before it imports Ray (launch/quiet.py): the in-process jobs of this session
# see Ray's output as a user's job does (Ray reads the variable once, at `import ray`).
from elastic_train.launch.quiet import export_skip_regex  # noqa: E402  (imports no Ray)

export_skip_regex()

# torch's intra-op pool spins at its barriers: on a 2-core box that other processes (Ray workers, another
# pytest) also keep busy, two threads made the in-process unit tests ~4x slower than one (make test-fast: 49 s
# vs 16 s under a load of ~4.5; the same ~10-15 s on an idle box). One thread in the test process itself;
# subprocesses and Ray workers are left alone, and an explicit OMP_NUM_THREADS wins.
if "OMP_NUM_THREADS" not in os.environ:
    import torch

    torch.set_num_threads(1)


RAY_TEST_CPUS = 4  # logical CPUs on a 2-core box: 2 workers plus drivers and sweep trials


@pytest.fixture(scope="session")
def _ray_teardown():
    import ray

    yield
    if ray.is_initialized():
        ray.shutdown()


def ensure_ray():
    """The session's local Ray, started on first use (and again after a multi-node test shut it down)."""
    import ray

    if not ray.is_initialized():
        from elastic_train.launch.context import embedded_dashboard

        # address="local": always our own instance, never a head someone started with `ray start`; a dashboard
        # where a run's embedded Ray would have one (the public path's PlacementGroupCleaner needs its state API)
        ray.init(address="local", num_cpus=RAY_TEST_CPUS, include_dashboard=embedded_dashboard(),
                 logging_level="ERROR")
    return ray


@pytest.fixture
def ray_session(_ray_teardown):
    return ensure_ray()


@pytest.fixture(scope="module")
def ray_module(_ray_teardown):
    """For module-scoped fixtures that run jobs (shared expensive runs)."""
    return ensure_ray()


@pytest.fixture(scope="session")
def session_home(tmp_path_factory) -> Path:
    """A home shared by the session's runs: one MLflow sqlite store (creating one costs ~2 s)."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture
def home(session_home: Path, tmp_path: Path, monkeypatch) -> Path:
    """ELASTIC_TRAIN_HOME for one test: its own results folder, the session's MLflow store."""
    monkeypatch.setenv("ELASTIC_TRAIN_HOME", str(session_home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    results.mkdir()
    return results


def tiny(*extra: str) -> list[str]:
    """The real digits preset, shrunk: 2 epochs, no system-metrics thread."""
    return [
        "train.epochs=2",
        "tracking.system_metrics=false",
        *extra,
    ]


# The count of private names on the default path (issue 50 item 4): the runs that make it up record the registry
# entries they touch (ELASTIC_TRAIN_COMPAT_TRACE, compat/features.py), one file each, in this session's folder;
# tests/e2e/test_job_submit.py adds them up.
DEFAULT_PATH_RUNS = ("digits", "sweep", "job")


def compat_trace_dir() -> Path:
    path = Path(os.environ.get("PYTEST_COMPAT_TRACES", "")) if os.environ.get("PYTEST_COMPAT_TRACES") else None
    if path is None:
        import tempfile

        path = Path(tempfile.mkdtemp(prefix="compat-traces-"))
        os.environ["PYTEST_COMPAT_TRACES"] = str(path)
    return path


@contextmanager
def traced(name: str) -> Iterator[Path]:
    """Within: this process (and the runs it starts) record the internals they use in ``<session dir>/<name>``."""
    from elastic_train.compat.features import TRACE_ENV

    path = compat_trace_dir() / name
    before = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(TRACE_ENV, None)
        else:
            os.environ[TRACE_ENV] = before


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API (moto_server, IAM auth on) on 127.0.0.1 for the session; see tests/helpers/s3.py."""
    from tests.helpers.s3 import start_s3_server

    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server, monkeypatch) -> str:
    """A fresh bucket, with the standard AWS_* environment pointing at the session's S3 server."""
    import uuid

    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    name = f"et-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=name)
    return name
