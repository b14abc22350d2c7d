"""A real S3 API on 127.0.0.1: ``moto_server`` (moto[server], a dev extra) in a subprocess, with IAM auth on.

Authentication is enforced (``INITIAL_NO_AUTH_ACTION_COUNT``: the first three requests, which create the test
user, its policy and its access key, are the only unauthenticated ones), so a wrong secret is refused as a real
S3 would refuse it. Started once per test session by the ``s3_server`` fixture (tests/conftest.py), stopped at
its end; every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REGION = "us-east-1"
_SETUP_ACTIONS = 3  # create_user, put_user_policy, create_access_key
_ALLOW_ALL = '{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}'


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    process: subprocess.Popen

    def env(self) -> dict[str, str]:
        """The standard AWS environment a client (pyarrow, boto3, Ray workers) picks up."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }

    def client(self, service: str = "s3"):  # a boto3 client
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_server_binary() -> str | None:
    here = Path(sys.executable).with_name("moto_server")
    return str(here) if here.exists() else shutil.which("moto_server")


def start_s3_server(timeout_s: float = 30.0) -> S3Server:
    """Start ``moto_server`` on a free port, wait (bounded) until it answers, create a user with an access key."""
    binary = moto_server_binary()
    if binary is None:
        raise RuntimeError("moto_server not found: install the dev extras (moto[server])")
    port = _free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(_SETUP_ACTIONS)}
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(k, None)
    proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited with {proc.returncode} before answering")
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait(timeout=10)
                raise RuntimeError(f"moto_server did not answer on {endpoint} within {timeout_s:g} s") from None
            time.sleep(0.05)
    server = S3Server(endpoint, "", "", proc)
    try:
        import boto3

        iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION,
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="elastic-train-test")
        iam.put_user_policy(UserName="elastic-train-test", PolicyName="all", PolicyDocument=_ALLOW_ALL)
        key = iam.create_access_key(UserName="elastic-train-test")["AccessKey"]
    except Exception:
        server.stop()
        raise
    server.access_key, server.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
    return server


class OutageGate:
    """The S3 endpoint the run uses, in front of the session's server: it goes away for ``outage_s`` seconds
    on the first request whose bytes hold ``trip_on`` (say, a checkpoint's folder), then comes back on the
    same port.

    Going away is what a stopped server does to its clients: the listening socket closes (new connections are
    refused) and every open connection, the tripping request's included, is reset. The server process runs on
    behind the gate because moto keeps its objects in memory: a real server's disk outlives its restart, and the
    bucket (earlier checkpoints, Ray Train's snapshot) must too for the run to go on.
    """

    def __init__(self, upstream: str, trip_on: bytes, outage_s: float):
        self.upstream_port = int(upstream.rsplit(":", 1)[1])
        self.trip_on, self.outage_s = trip_on, outage_s
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.tripped_at: float | None = None
        self.reopened_at: float | None = None
        self.reset_connections = 0  # client connections the outage reset
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._closed = False
        self._open()

    # ------------------------------------------------------------------ listening
    def _open(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True, name="s3-gate-accept").start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # the listener closed: the outage, or the end
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._conns += [client, server]
            done = threading.Semaphore(0)  # each direction releases it once; the second one closes both
            threading.Thread(target=self._pump, args=(client, server, True, done), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False, done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool, done: threading.Semaphore) -> None:
        tail = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if from_client and data and self.tripped_at is None and self.trip_on in tail + data:
                self._trip()  # resets this connection too: the tripping request never reaches the server
                return
            if not data:
                break
            tail = data[-len(self.trip_on):]
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)  # pass the end on gracefully: what was sent still arrives
        except OSError:
            pass
        if done.acquire(blocking=False):  # the other direction ended first
            with self._lock:
                self._conns = [c for c in self._conns if c not in (src, dst)]
            src.close()
            dst.close()
        else:
            done.release()

    # ------------------------------------------------------------------ the outage
    def _trip(self) -> None:
        with self._lock:
            if self.tripped_at is not None:
                return
            self.tripped_at = time.monotonic()
            listener, conns, self._conns = self._listener, self._conns, []
            self.reset_connections = len(conns) // 2
        _close_listener(listener)
        for c in conns:
            _reset(c)
        timer = threading.Timer(self.outage_s, self._reopen)  # the outage's length: the scenario, not a wait
        timer.daemon = True
        timer.start()

    def _reopen(self) -> None:
        if self._closed:
            return
        self._open()
        self.reopened_at = time.monotonic()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            conns, self._conns = self._conns, []
        if self._listener is not None:
            _close_listener(self._listener)
        for c in conns:
            _reset(c)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dying server's kernel does; wake this socket's reader."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass
    sock.close()


def _close_listener(sock: socket.socket) -> None:
    """Stop listening (new connections are refused); shutdown wakes the blocked accept, close alone does not."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class SlowLink:
    """The S3 endpoint the run uses, in front of the session's server, over a link whose upstream (client to
    server: every upload) carries ``up_bytes_per_s``, shared by all connections, as a WAN link or a busy NIC does.
    Downloads are not limited. ``uploaded`` counts the bytes that crossed it."""

    def __init__(self, upstream: str, up_bytes_per_s: float):
        self.upstream_port = int(upstream.rsplit(":", 1)[1])
        self.rate = float(up_bytes_per_s)
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.uploaded = 0
        self._lock = threading.Lock()
        self._free_at = time.monotonic()  # when the link has sent everything handed to it so far
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True, name="s3-slow-link").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            done = threading.Semaphore(0)  # each direction releases it once; the second one closes both
            threading.Thread(target=self._pump, args=(client, server, True, done), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False, done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool, done: threading.Semaphore) -> None:
        while True:
            try:
                data = src.recv(16384)
            except OSError:
                data = b""
            if not data:
                break
            if upstream:
                self._carry(len(data))
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)  # pass the end on: what was sent still arrives
        except OSError:
            pass
        if done.acquire(blocking=False):  # the other direction ended first
            src.close()
            dst.close()
        else:
            done.release()

    def _carry(self, n: int) -> None:
        """``n`` bytes cross the link: they leave once it has sent what it held before, at its rate."""
        with self._lock:
            self.uploaded += n
            self._free_at = max(self._free_at, time.monotonic()) + n / self.rate
            done = self._free_at
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)  # the link's speed: the scenario, not a wait for something

    def close(self) -> None:
        _close_listener(self._listener)
