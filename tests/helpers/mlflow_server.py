"""A real ``mlflow server`` (``python -m tracking.server``) on 127.0.0.1 that a test or bench/chaos.py owns:
``stop()`` and ``start()`` keep the same port and store, so a run can lose its server mid-run and get it back.
Every wait is bounded."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """One ``python -m tracking.server`` process in its own session, one worker."""

    def __init__(self, home: Path, port: int | None = None, basic_auth: bool = False,
                 password: str = "s3cret-pass-Aa1"):
        self.home, self.port = Path(home), port or free_port()
        self.basic_auth, self.password = basic_auth, password
        self.home.mkdir(parents=True, exist_ok=True)
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 240) -> MlflowServer:
        """Start it and wait (bounded) until ``/health`` answers."""
        argv = [sys.executable, "-m", "tracking.server", "--port", str(self.port), "--home", str(self.home),
                "--workers", "1"]
        env = dict(os.environ)
        if self.basic_auth:
            argv.append("--basic-auth")
            env["MLFLOW_AUTH_ADMIN_PASSWORD"] = self.password
        with open(self.home / "server.log", "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.home / 'server.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mlflow server on {self.uri} did not answer within {timeout_s:g} s")
            time.sleep(0.2)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 20 s."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        self.proc = None
