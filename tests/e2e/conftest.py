"""Real Ray processes for the end-to-end tests.

``ray_head`` starts a head the way a user does, with ``cluster/local/start-head.sh --block`` (token auth
on, a token generated in ~/.ray/auth_token, dashboard on 127.0.0.1), but with its own HOME, free ports
and a short temp dir of its own, so it never meets another Ray on this machine. ``ray_head.add_node()``
joins a second node through ``cluster/local/add-worker.sh`` with its own ports and temp dir.
``ray_head.submit(...)`` runs the real ``ray job submit`` CLI. Every process a fixture starts is stopped
by that fixture (its process group and every descendant), also when the test fails; nothing else is.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # the venv running pytest: the cluster's `python` and `ray`
RAY = str(VENV_BIN / "ray")
READY_TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------------------- ports


def free_ports(n: int, avoid: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """``n`` distinct ports that are free right now and not in ``avoid`` (ports promised to a node that has not
    bound them yet, e.g. its worker-port range): all held open while choosing, so no duplicates."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
            if s.getsockname()[1] not in avoid:
                ports.append(s.getsockname()[1])
            if len(socks) > n + 1000:
                raise RuntimeError(f"no {n} free ports outside the {len(avoid)} already promised")
        return ports
    finally:
        for s in socks:
            s.close()


def free_port_range(size: int, avoid: set[int]) -> tuple[int, int]:
    """A run of ``size`` consecutive free ports for Ray's worker processes."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - size)
        span = range(base, base + size)
        if avoid.intersection(span):
            continue
        if all(_port_free(p) for p in span):
            return base, base + size - 1
    raise RuntimeError(f"no {size} consecutive free ports found")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def node_ports(taken: set[int]) -> list[str]:
    """``ray start`` flags giving every listening port of one node a free, explicit value."""
    names = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port"]
    ports = free_ports(len(names), taken)
    taken.update(ports)
    lo, hi = free_port_range(64, taken)
    taken.update(range(lo, hi + 1))
    return [f"--{n}={p}" for n, p in zip(names, ports, strict=True)] + [
        f"--min-worker-port={lo}", f"--max-worker-port={hi}"
    ]


# ---------------------------------------------------------------------------------------- processes


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    return children


def descendants(pid: int) -> set[int]:
    children, out, todo = _children_map(), set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class RayProcess:
    """One ``ray start --block`` in its own session; ``stop()`` ends it and everything it spawned."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path):
        self.args, self.log_path = args, log_path
        self._log = open(log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(args, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to ``ray start`` alone (an idle node shuts down in order in ~3 s; after a job it can hang
        for longer than ``ray stop``'s 16 s); then SIGKILL whatever is left of its process tree."""
        pids = descendants(self.proc.pid) | {self.proc.pid}
        try:
            self.proc.terminate()
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            pids |= {d for p in list(pids) if _alive(p) for d in descendants(p)}
            time.sleep(0.2)
        self._kill({p for p in pids if _alive(p)})
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def _kill(self, pids: set[int]) -> None:
        if self.proc.poll() is None:  # still ours (not reaped): its group is ray start and what it forked
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in pids:  # Ray workers start their own groups; they are still our descendants
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


# ---------------------------------------------------------------------------------------- cluster


@dataclass
class LocalCluster:
    """A token-protected local Ray cluster started by ``cluster/local/*.sh``, and the clients a user runs."""

    short_dir: Path  # Ray's temp dirs (unix socket paths must stay under ~107 characters)
    work: Path  # logs, MLflow store, results, summaries
    home: Path  # the cluster user's HOME: start-head.sh generates ~/.ray/auth_token here
    gcs_port: int
    dashboard_port: int
    taken: set[int]
    processes: list[RayProcess] = field(default_factory=list)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def token_path(self) -> Path:
        return self.home / ".ray" / "auth_token"

    @property
    def token(self) -> str:
        return self.token_path.read_text().strip()

    def node_env(self) -> dict[str, str]:
        """What the scripts run under: the venv first on PATH, our HOME, no Ray or MLflow settings of ours."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "MLFLOW_TRACKING_URI"))}
        env.update(PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", HOME=str(self.home),
                   VIRTUAL_ENV=str(VENV_BIN.parent),  # the scripts' venv is this one (make test-versions: another)
                   RAY_USAGE_STATS_ENABLED="0", NUM_GPUS="0")  # CPU torch here, even on a GPU machine
        return env

    def client_env(self, authorised: bool = True, token: str | None = None) -> dict[str, str]:
        """A ``ray job submit`` user: the owner (token in ~/.ray/auth_token), a stranger, or a wrong token."""
        env = self.node_env()
        if authorised:
            env["RAY_AUTH_MODE"] = "token"
            return env
        stranger = self.work / "stranger-home"  # no ~/.ray/auth_token to fall back on
        stranger.mkdir(exist_ok=True)
        env["HOME"] = str(stranger)
        if token is not None:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        return env

    def claim_port(self) -> int:
        """A free port outside every range already promised to this cluster's nodes (then promised too)."""
        port = free_ports(1, self.taken)[0]
        self.taken.add(port)
        return port

    def start_node(self, head: bool) -> RayProcess:
        n = len(self.processes)
        flags = ["--block", "--node-ip-address=127.0.0.1", "--num-cpus=2", "--object-store-memory=200000000",
                 f"--temp-dir={self.short_dir / f'n{n}'}", *node_ports(self.taken)]
        env = self.node_env()
        if head:
            env.update(RAY_PORT=str(self.gcs_port), RAY_DASHBOARD_PORT=str(self.dashboard_port))
            args = ["bash", str(ROOT / "cluster/local/start-head.sh"), *flags,
                    f"--ray-client-server-port={self.claim_port()}"]
        else:
            args = ["bash", str(ROOT / "cluster/local/add-worker.sh"), self.gcs_address, *flags]
        proc = RayProcess(args, env, self.work / f"node{n}.log")
        self.processes.append(proc)
        return proc

    def add_node(self) -> RayProcess:
        """Join one more node and wait until the cluster reports it alive."""
        want = len(self.alive_nodes()) + 1
        proc = self.start_node(head=False)
        self.wait_for(lambda: len(self.alive_nodes()) >= want, f"{want} alive nodes", proc)
        return proc

    def wait_for(self, ready: Any, what: str, proc: RayProcess, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not proc.alive():
                pytest.fail(f"`{' '.join(proc.args[:3])} ...` exited before {what}:\n{proc.tail()}")
            if ready():
                return
            time.sleep(0.5)
        pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}:\n{proc.tail()}")

    # ---- clients

    def api(self, path: str, token: str | None = "") -> tuple[int, Any]:
        """GET the dashboard's HTTP API (with this cluster's token unless told otherwise)."""
        request = urllib.request.Request(self.dashboard_url + path)
        token = self.token if token == "" else token
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                body = r.read()
                return r.status, json.loads(body) if body else None
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return 0, None

    def alive_nodes(self) -> list[dict[str, Any]]:
        status, body = self.api("/api/v0/nodes?limit=100&detail=true")
        if status != 200:
            return []
        return [n for n in body["data"]["result"]["result"] if n["state"] == "ALIVE"]

    def job(self, submission_id: str) -> dict[str, Any] | None:
        status, body = self.api(f"/api/jobs/{submission_id}")
        return body if status == 200 else None

    def actors(self, job_id: str) -> list[dict[str, Any]]:
        status, body = self.api(f"/api/v0/actors?limit=1000&detail=true&filter_keys=job_id"
                                f"&filter_predicates=%3D&filter_values={job_id}")
        assert status == 200, body
        return body["data"]["result"]["result"]

    def submit(self, submission_id: str, entrypoint: list[str], *, env: dict[str, str] | None = None,
               env_vars: dict[str, str] | None = None, timeout_s: float = 300) -> subprocess.CompletedProcess:
        """``ray job submit --working-dir <repo> -- ENTRYPOINT``, exactly as the README shows it."""
        args = [RAY, "job", "submit", "--address", self.dashboard_url, "--submission-id", submission_id,
                "--working-dir", str(ROOT)]
        if env_vars:
            args += ["--runtime-env-json", json.dumps({"env_vars": env_vars})]
        return subprocess.run([*args, "--", *entrypoint], cwd=ROOT, env=env or self.client_env(),
                              capture_output=True, text=True, timeout=timeout_s, check=False)


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory) -> Iterator[LocalCluster]:
    """``cluster/local/start-head.sh --block`` on free ports with its own temp dir, HOME and token."""
    work = tmp_path_factory.mktemp("ray-e2e")
    home = work / "home"
    home.mkdir()
    short_dir = Path(tempfile.mkdtemp(prefix="et-", dir="/tmp"))
    gcs_port, dashboard_port = free_ports(2)
    cluster = LocalCluster(short_dir, work, home, gcs_port, dashboard_port, {gcs_port, dashboard_port})
    try:
        head = cluster.start_node(head=True)
        cluster.wait_for(lambda: cluster.token_path.exists() and cluster.api("/api/jobs/")[0] == 200
                         and len(cluster.alive_nodes()) == 1, "the job server", head)
        yield cluster
    finally:
        for proc in reversed(cluster.processes):
            proc.stop()
        shutil.rmtree(short_dir, ignore_errors=True)


@pytest.fixture
def second_node(ray_head: LocalCluster) -> Iterator[RayProcess]:
    """``cluster/local/add-worker.sh`` joined to ``ray_head``; stopped after the test."""
    proc = ray_head.add_node()
    try:
        yield proc
    finally:
        proc.stop()
        ray_head.processes.remove(proc)
