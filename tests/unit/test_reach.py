"""Reaching Ray never hangs (elastic_train.launch.reach): real sockets, a real leftover ``ray_current_cluster``.

The in-process tests use a port nobody listens on (bound, then closed) and a real listening socket; two real
``python -m`` processes (marked ``subprocess``) check the whole path: an ``--address`` nobody answers exits 2
within the bound, and a stale head file still lets the embedded default start.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from elastic_train.errors import ConfigError
from elastic_train.launch import reach
from tests.conftest import ROOT


@pytest.fixture
def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connects are refused at once
    return port


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def ray_tmp(tmp_path: Path, address: str | None) -> dict[str, str]:
    """An environment whose Ray temp dir holds a ``ray_current_cluster`` naming ``address`` (None: no file)."""
    (tmp_path / "ray").mkdir()
    if address is not None:
        (tmp_path / "ray" / "ray_current_cluster").write_text(address + "\n")
    return {"RAY_TMPDIR": str(tmp_path)}


@pytest.mark.parametrize("address, expected", [
    ("127.0.0.1:6379", ("127.0.0.1", 6379)),
    ("ray://head.example:10001", ("head.example", 10001)),
    ("[::1]:6379", ("::1", 6379)),
    ("head-without-port", None),
    ("host:notaport", None),
])
def test_host_port(address, expected):
    assert reach.host_port(address) == expected


def test_probe_a_closed_port_says_refused_within_the_bound(closed_port):
    t0 = time.monotonic()
    why = reach.probe(f"127.0.0.1:{closed_port}", timeout_s=0.5)
    assert why is not None and "refused" in why
    assert time.monotonic() - t0 < 3.0


def test_probe_a_listening_socket_answers(listener):
    assert reach.probe(f"127.0.0.1:{listener}", timeout_s=2.0) is None


def test_explicit_address_nobody_answers_is_a_config_error_naming_it(closed_port):
    address = f"127.0.0.1:{closed_port}"
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        reach.choose(address, timeout_s=0.6, environ={})
    assert e.value.field == "--address" and e.value.value == address
    assert "connect_timeout_s" in str(e.value)
    assert time.monotonic() - t0 < 3.0


def test_ray_address_variable_is_named_when_it_does_not_answer(closed_port):
    with pytest.raises(ConfigError) as e:
        reach.choose(None, timeout_s=0.3, environ={"RAY_ADDRESS": f"127.0.0.1:{closed_port}"})
    assert e.value.field == "RAY_ADDRESS"


def test_explicit_address_that_answers_is_used(listener):
    target = reach.choose(f"127.0.0.1:{listener}", timeout_s=2.0, environ={})
    assert not target.embedded and target.init_address() == f"127.0.0.1:{listener}"


@pytest.mark.parametrize("environ,address", [({}, "ray://10.0.0.1:10001"),
                                              ({"RAY_ADDRESS": "RAY://head:10001"}, None)])
def test_a_ray_client_address_is_refused_at_once_naming_what_to_do(environ, address):
    with pytest.raises(ConfigError) as e:
        reach.choose(address, timeout_s=0.1, environ=environ)
    assert e.value.field == ("--address" if address else "RAY_ADDRESS")
    assert "Ray Client (ray://) is not supported" in str(e.value) and "ray job submit" in str(e.value)


def test_local_means_embedded():
    assert reach.choose("local", timeout_s=1.0, environ={}).embedded


def test_stale_head_file_falls_back_to_embedded_with_one_warning_naming_it(tmp_path, closed_port):
    env = ray_tmp(tmp_path, f"127.0.0.1:{closed_port}")
    target = reach.choose(None, timeout_s=30.0, environ=env)
    assert target.embedded and target.init_address() == "local"
    path = str(tmp_path / "ray" / "ray_current_cluster")
    assert path in target.warning and f"127.0.0.1:{closed_port}" in target.warning and "\n" not in target.warning


def test_live_head_file_is_used_through_ray_own_lookup(tmp_path, listener):
    target = reach.choose(None, timeout_s=5.0, environ=ray_tmp(tmp_path, f"127.0.0.1:{listener}"))
    assert not target.embedded and target.warning is None
    assert target.init_address() is None  # ray.init(address=None) reads the file and turns token auth on


def test_no_head_file_is_embedded_without_a_warning(tmp_path):
    target = reach.choose(None, timeout_s=5.0, environ=ray_tmp(tmp_path, None))
    assert target.embedded and target.warning is None


def test_auto_with_a_stale_file_names_the_file(tmp_path, closed_port):
    with pytest.raises(ConfigError) as e:
        reach.choose("auto", timeout_s=0.3, environ=ray_tmp(tmp_path, f"127.0.0.1:{closed_port}"))
    assert e.value.field == "--address" and "ray_current_cluster" in str(e.value)


def test_auto_without_a_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        reach.choose("auto", timeout_s=0.3, environ=ray_tmp(tmp_path, None))


def test_bounded_gives_up_on_a_call_that_never_returns():
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as e:
        reach.bounded(release.wait, 0.3, "--address", "10.0.0.1:6379")
    release.set()
    assert e.value.field == "--address" and "did not connect within 0.3s" in str(e.value)
    assert time.monotonic() - t0 < 2.0


def test_bounded_reraises_the_call_error():
    def fail():
        raise ConnectionError("boom")

    with pytest.raises(ConnectionError, match="boom"):
        reach.bounded(fail, 5.0, "--address", "x:1")


def _job(*args: str, env: dict[str, str], timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=timeout, env={**os.environ, **env})
    return out, time.monotonic() - t0


@pytest.mark.subprocess
@pytest.mark.parametrize("answers, needle", [(False, "no Ray cluster answers there"),
                                             (True, "Ray did not connect within 3s")])
def test_an_address_that_is_no_ray_head_exits_2_within_the_bound(closed_port, listener, tmp_path, answers, needle):
    """``python -m jobs.train --address`` at a dead port (the TCP probe fails), or at a socket that accepts and
    says nothing (``ray.init`` would retry forever): exit 2 naming it, within the bound, no traceback."""
    address = f"127.0.0.1:{listener if answers else closed_port}"
    out, took = _job("jobs.train", "--address", address, "failure.connect_timeout_s=3",
                     env={"ELASTIC_TRAIN_HOME": str(tmp_path)}, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"--address='{address}'" in out.stderr and needle in out.stderr and "Traceback" not in out.stderr
    assert "ray:" not in out.stdout  # nothing was started
    assert took < 90  # imports dominate; the wait itself is 3 s (6 s: probe, then ray.init)


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_stale_head_file_still_starts_the_embedded_default(closed_port, tmp_path):
    """The issue's hang: a ``ray start`` head died without ``ray stop`` and left its file behind. The default
    (no address) warns once naming the file and runs on an embedded Ray (preflight: connects, trains nothing)."""
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # Ray's socket paths must stay under ~107 bytes
    try:
        env = {**ray_tmp(short, f"127.0.0.1:{closed_port}"), "ELASTIC_TRAIN_HOME": str(tmp_path)}
        out, took = _job("jobs.preflight", "scaling.num_workers=1", env={**env, "RAY_ADDRESS": ""}, timeout=180)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "ray: embedded local Ray" in out.stdout
        assert str(short / "ray" / "ray_current_cluster") in out.stderr
    finally:
        shutil.rmtree(short, ignore_errors=True)


def test_the_client_token_is_read_as_ray_reads_it(tmp_path):
    from elastic_train.launch.reach import client_token

    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("from-file\n")
    assert client_token({"HOME": str(home)})[0] is None  # an explicit address: only with RAY_AUTH_MODE=token
    assert client_token({"HOME": str(home)}, automatic=True) == ("from-file", str(home / ".ray" / "auth_token"))
    env = {"HOME": str(home), "RAY_AUTH_MODE": "token"}
    assert client_token(env)[0] == "from-file"
    assert client_token({**env, "RAY_AUTH_TOKEN": "from-env"}) == ("from-env", "$RAY_AUTH_TOKEN")
    other = tmp_path / "other"
    other.write_text("from-path")
    assert client_token({**env, "RAY_AUTH_TOKEN_PATH": str(other)})[0] == "from-path"
    assert client_token({"HOME": str(tmp_path / "nobody"), "RAY_AUTH_MODE": "token"})[0] is None
    # an explicit mode is respected, also for the head found by itself (Ray's maybe_enable_token_auth...)
    assert client_token({"HOME": str(home), "RAY_AUTH_MODE": "disabled"}, automatic=True)[0] is None


def test_a_gcs_that_speaks_no_grpc_gives_no_verdict(listener):
    """Something listens but is no GCS: the probe says nothing (ray.init then meets it under its own bound)."""
    from elastic_train.compat.ray_core import gcs_refuses_token

    assert gcs_refuses_token(f"127.0.0.1:{listener}", None, 1.0) is None


@pytest.mark.parametrize(("address", "expected"), [
    ("10.0.0.5:6379", {"RAY_ADDRESS": "10.0.0.5:6379"}),
    ("127.0.0.1:6380", {"RAY_ADDRESS": "192.0.2.7:6380"}),  # named over loopback: the node's address for the rest
    ("localhost:6379", {"RAY_ADDRESS": "192.0.2.7:6379"}),
    ("[::1]:6379", {"RAY_ADDRESS": "192.0.2.7:6379"}),
    ("[fd00::5]:6379", {"RAY_ADDRESS": "[fd00::5]:6379"}),
    ("head-without-port", {}),
])
def test_the_jobs_processes_are_told_which_cluster_is_theirs(address, expected, tmp_path):
    """Ray Train's PlacementGroupCleaner asks the state API for the cluster in $RAY_ADDRESS; without it, the last
    `ray start` head on its host, which may be another cluster's (it then removed a live run's placement group)."""
    target = reach.RayTarget(address, f"cluster at {address}", "--address")
    environ = {"RAY_TMPDIR": str(tmp_path)}  # no ray_current_cluster: nothing says which cluster is the host's
    assert reach.job_processes_env(target, lambda: "192.0.2.7", environ=environ) == expected
    other = reach.cluster_file(environ)
    other.parent.mkdir(parents=True)
    other.write_text("198.51.100.9:6379")  # the last `ray start` on this host is another cluster's head
    assert reach.job_processes_env(target, lambda: "192.0.2.7", environ=environ) == expected


@pytest.mark.parametrize(("address", "recorded"), [
    ("10.0.0.5:6379", "10.0.0.5:6379"),
    ("127.0.0.1:6380", "192.0.2.7:6380"),  # the same head, named over loopback here and by the node's address there
    ("192.0.2.7:6379", "127.0.0.1:6379"),
])
def test_no_job_runtime_env_when_the_hosts_head_is_this_cluster_or_no_cleaner_starts(address, recorded, tmp_path):
    """A job runtime env makes Ray start every process of the job through its runtime-env agent, none from its
    idle workers (a sweep's trial took 10.2 s instead of 6.6): none when the cleaner's own lookup finds this cluster
    (ray_current_cluster names it: a `ray start` head, the usual case), nor for a sweep whose reaper replaces the
    cleaners."""
    target = reach.RayTarget(address, f"cluster at {address}", "--address")
    environ = {"RAY_TMPDIR": str(tmp_path)}
    assert reach.job_processes_env(target, lambda: "192.0.2.7", environ=environ, starts_cleaner=False) == {}
    assert reach.job_processes_env(target, lambda: "192.0.2.7", environ=environ) != {}
    reach.cluster_file(environ).parent.mkdir(parents=True)
    reach.cluster_file(environ).write_text(recorded)
    assert reach.job_processes_env(target, lambda: "192.0.2.7", environ=environ) == {}
