"""A fault campaign: one training run, a seeded schedule of mixed faults, and what was injected, survived and lost.

    .venv/bin/python bench/chaos.py --smoke          # 6 mixed faults over 3 epochs
    .venv/bin/python bench/chaos.py --seed 7         # 20 faults (the campaign) over 8 epochs
    .venv/bin/python bench/chaos.py --faults 30 --epochs 12
    .venv/bin/python bench/chaos.py --hosts --seed 5  # on separate hosts (cluster.sim; root): 20 faults

The campaign owns everything it breaks: a multi-node ``ray.cluster_utils.Cluster`` (a head and ``--nodes``
worker nodes of one CPU each; the storage is a local folder every node on this machine shares), a real
``mlflow server`` subprocess (tests/helpers/mlflow_server.py), and the driver: ``python -m jobs.train`` on the
digits preset with ``scaling.num_workers=[1,N]`` as a subprocess it can SIGKILL. Fault kinds, drawn from
``--seed``:

* in the workers, through ``$ELASTIC_TRAIN_FAULT`` (elastic_train/train/faults.py): ``exit`` (the process dies),
  ``raise`` (the training function raises), ``save`` (death inside a checkpoint save), ``pair`` (two of those
  closer together than one checkpoint interval);
* by the campaign, when the run reaches the scheduled step (read from the sample-id trace): ``node`` (a worker
  node removed, a fresh one added back a few steps later), ``drain`` (a worker node drained for preemption
  through the GCS ``drain_node`` call, the just-in-time checkpoint awaited, then the node removed and later
  replaced), ``driver`` (the driver SIGKILLed, then the same command run again: the job resumes by name),
  ``mlflow`` (the tracking server stopped and started again at once: the outage lasts one server start,
  13-17 s on this box, over a minute under heavy load).

``--hosts`` runs the campaign on separate hosts (cluster/sim.py: network namespaces on a bridge of its own,
``--bridge etchaos0``, 198.18.5.0/24): a head with 0 CPUs and two worker hosts of 1 CPU each, checkpoints in
``s3://sim/runs``, the job submitted from the laptop with ``ray job submit`` (``HostsWorld``). Its kinds: the
worker kinds; ``host`` (every process of rank 0's host SIGKILLed at once, the host joined again with
``add-worker.sh`` 3 steps later); ``partition`` (rank 0's host's link down 15-25 s, drawn from the seed: longer
than the 10 s in which the head declares a silent node dead; then up: its raylet exits when it hears it was
declared dead, and ``add-worker.sh --rejoin``'s supervisor joins the host again by itself, ``rejoined_s`` after
the heal);
``driver`` (``ray job stop``, then the same submission again: the run resumes by name); ``mlflow`` (the sim's
server stopped by its process group, started again with the same command line); ``head`` (every process of the
head's host SIGKILLed at once: the GCS, the dashboard, the job's driver and Train controller; a new head on the
same address with the same Redis, ``cluster.sim.restart_head``; the worker hosts back in Ray; the job submitted
again under the same run name, which resumes from its last complete checkpoint). With ``head`` among the kinds the
sim runs with GCS fault tolerance on (``up --gcs-ft``: the GCS's tables in a real Redis). Its phases, seconds
from the kill: ``detection_s`` (the laptop's ``ray job submit`` ends: what a platform watching the job sees),
``head_back_s`` (the new head's job server answers), ``workers_back_s`` (both worker hosts alive in Ray again),
``resubmitted_s`` (the job submitted again), then the recovery phases of the new driver's first attempt.
``node`` and ``drain`` are the single-host Cluster's. ``detection_s`` of ``host`` and ``partition``: the Train
controller's failure decision after the fault. One host is away at a time (a host fault due meanwhile waits for
the next step; a head loss waits until both worker hosts are in).

A fault-free run with the same config is the reference. Printed JSON: each fault (kind, scheduled and fired
step, campaign time, detection, recovery split into phases, steps lost) and totals: injected, survived,
samples lost (sample-id trace, exactly once per epoch), mean and worst recovery, restarts, the goodput ledger
(parts summing to wall), one MLflow run with every step's ``train_loss`` once and status FINISHED, and
``params_sha256`` against the reference (bitwise when the world size never changed; otherwise the train loss
within 1e-4 relative).

Phases of one recovery (unix times noted by the workers, ``markers=DIR`` in the fault spec):
``ray_restart_s`` fault -> new worker process started (Ray: detection, teardown, placement, process start; for
``driver`` also our relaunch: a new Python, imports, preflight); ``worker_setup_s`` process start -> our train
function entered; ``build_s`` -> data and model built (ours); ``restore_s`` -> checkpoint loaded (ours);
``first_step_s`` -> the first optimizer step done (ours). ``ray_train_phases_s`` splits the first two at the
Train controller's events (launch/controller.RestartPhases): detection, teardown, placement, process start,
process group, dispatch. ``detection_s``: for ``driver`` and the campaign's own faults it is 0 by construction
(the campaign acts at once); for worker faults, the controller's failure decision after the fault (its 0.2 s
health poll here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N_TRAIN, GLOBAL_BATCH = 1438, 128  # digits: train samples, and the preset's global batch
STEPS_PER_EPOCH = N_TRAIN // GLOBAL_BATCH
WORKER_KINDS = ("exit", "raise", "save", "pair")
CAMPAIGN_KINDS = ("node", "drain", "driver", "mlflow", "host", "partition", "head")
KINDS = WORKER_KINDS + CAMPAIGN_KINDS[:4]  # the single-host Cluster's campaign
HOSTS_KINDS = WORKER_KINDS + ("host", "partition", "driver", "mlflow", "head")  # --hosts: separate hosts (cluster.sim)
LOSS_KINDS = ("node", "drain", "host", "partition")  # a worker node or host goes and comes back
NAME = "chaos"


# ------------------------------------------------------------------------------------------------ schedule


def draw_schedule(seed: int, n_faults: int, total_steps: int, every: int, workers: int,
                  kinds: tuple[str, ...] = KINDS, gap: int = 3, readd_room: int = 3) -> list[dict]:
    """``n_faults`` faults at distinct steps in [2, total_steps - 2], drawn from ``seed``.

    A ``pair`` is two worker faults (exit then raise, or the reverse) one to ``every - 1`` steps apart: closer
    than one checkpoint interval. A campaign fault holds a window of ``gap`` steps (a node comes back, the
    MLflow server restarts at its end); windows never overlap, and an ``mlflow`` outage starts in the first
    half of the run so the server is back well before the end. A ``node`` or ``drain`` window ends at least
    ``readd_room`` steps before the last step: the node is re-added while the run still trains (a drain's
    removal waits for the just-in-time checkpoint, and the run goes on meanwhile). Worker faults after the
    first node loss hit rank 0 (a rank the shrunk world lacks would never fire). With two faults or more the
    schedule holds at least one worker fault and one campaign fault when ``kinds`` has both; with room for all
    (9 for the eight kinds: a pair is two), every kind in ``kinds`` at least once."""
    rng = random.Random(seed)
    worker_kinds = tuple(k for k in kinds if k in WORKER_KINDS)
    campaign_kinds = tuple(k for k in kinds if k in CAMPAIGN_KINDS)
    free = set(range(2, total_steps - 1))
    faults: list[dict] = []
    windows: list[tuple[int, int]] = []
    tries = 0
    while len(faults) < n_faults and free and tries < 10_000:
        tries += 1
        left = n_faults - len(faults)
        have = {f["kind"] for f in faults}
        pool = kinds
        missing = tuple(k for k in kinds if k not in have)
        if n_faults >= _slots(kinds) and _slots(missing) >= left:  # room for every kind: make sure of it
            pool = missing
        if left == 1 and n_faults >= 2 and worker_kinds and campaign_kinds:  # the mix: at least one of each
            if not have & set(campaign_kinds):
                pool = campaign_kinds
            elif not have & set(worker_kinds):
                pool = worker_kinds
        if left < 2:
            pool = tuple(k for k in pool if k != "pair") or ("exit",)
        kind = rng.choice(pool)
        step = rng.choice(sorted(free))
        if kind in CAMPAIGN_KINDS:
            end = step + gap
            last = total_steps - 2 - (readd_room if kind in LOSS_KINDS else 0)  # the window's latest end
            if end > last or any(a <= end and step <= b for a, b in windows):
                continue
            if kind == "mlflow" and step > total_steps // 2:
                continue
            windows.append((step, end))
            faults.append({"kind": kind, "mode": kind, "step": step, "until": end, "rank": None})
            if kind == "partition":  # how long the link stays down
                faults[-1]["down_s"] = round(rng.uniform(15, 25), 1)  # declared dead after ~10 s
            free.discard(step)
        elif kind == "pair":
            second = step + rng.randint(1, max(1, every - 1))
            if second not in free:
                continue
            first_mode, second_mode = rng.sample(["exit", "raise"], 2)
            faults.append({"kind": "pair", "mode": first_mode, "step": step, "rank": rng.randrange(workers)})
            faults.append({"kind": "pair", "mode": second_mode, "step": second, "rank": rng.randrange(workers)})
            free -= {step, second}
        else:
            faults.append({"kind": kind, "mode": kind, "step": step, "rank": rng.randrange(workers)})
            free.discard(step)
    faults.sort(key=lambda f: f["step"])
    shrunk = min((f["step"] for f in faults if f["kind"] in LOSS_KINDS), default=None)
    for f in faults:
        if f["kind"] in WORKER_KINDS and shrunk is not None and f["step"] >= shrunk:
            f["rank"] = 0
    return faults


def _slots(kinds: tuple[str, ...]) -> int:
    return sum(2 if k == "pair" else 1 for k in kinds)


def fault_spec(schedule: list[dict], markers: Path, delay: float) -> str:
    """The ``$ELASTIC_TRAIN_FAULT`` of the worker faults; every one fires once (``markers=DIR``), also across a
    driver restart. Fault ``i`` of the spec is the ``i``-th worker fault of the schedule."""
    parts = [f"step={f['step']},rank={f['rank']},mode={f['mode']}" for f in schedule if f["kind"] in WORKER_KINDS]
    return ";".join([*parts, f"delay={delay}", f"markers={markers}"])


# ------------------------------------------------------------------------------------------------ the world


@dataclass
class World:
    """What the campaign owns: the cluster, the MLflow server, the storage and the MLflow store."""

    home: Path
    cluster: Any
    mlflow: Any
    node_cpus: int = 1
    readds: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, home: Path, nodes: int = 1) -> World:
        import ray
        from ray.cluster_utils import Cluster

        from tests.helpers.mlflow_server import MlflowServer

        home.mkdir(parents=True, exist_ok=True)
        server = MlflowServer(home / "mlflow")
        if ray.is_initialized():
            ray.shutdown()
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        try:
            for _ in range(nodes):
                cluster.add_node(num_cpus=1)
            cluster.wait_for_nodes(timeout=60)
            ray.init(address=cluster.address, logging_level="ERROR")  # to read free CPUs
            server.start()
        except BaseException:
            server.stop()
            ray.shutdown()
            cluster.shutdown()
            raise
        return cls(home, cluster, server)

    def stop(self) -> None:
        import ray

        self.mlflow.stop()
        ray.shutdown()
        self.cluster.shutdown()

    def worker_nodes(self) -> list[Any]:
        return [n for n in self.cluster.list_all_nodes() if n is not self.cluster.head_node]

    def add_back(self, ev: dict) -> None:
        """A worker node again, after a ``node`` or ``drain`` fault (``ev``: its event)."""
        self.cluster.add_node(num_cpus=self.node_cpus)

    def driver(self, name: str, argv: list[str], spec: str | None, log: Path) -> Driver:
        return Driver(self, argv, job_env(self, spec), log)

    def job_argv(self, name: str, epochs: int, workers: int, every: int, trace: Path | None,
                 summary: Path) -> list[str]:
        return job_argv(self, name, epochs, workers, every, trace, summary)

    def wait_cpus_free(self, timeout_s: float = 60) -> bool:
        """Until every CPU of the cluster is free again (a killed driver's workers are gone), bounded."""
        import ray

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0) > 0:
                return True
            time.sleep(0.2)
        return False


class Progress:
    """The run's current global step, from the tail of rank 0's sample-id trace (read incrementally)."""

    def __init__(self, trace: Path):
        self.path = Path(f"{trace}.rank0")
        self.offset, self.step = 0, 0

    def poll(self) -> int:
        if self.path.exists():
            with open(self.path) as f:
                f.seek(self.offset)
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self.offset += len(complete.encode())
            for line in complete.splitlines():
                r = json.loads(line) if line.strip() else {}
                if "epoch" in r:
                    self.step = r["epoch"] * STEPS_PER_EPOCH + r["step"] + 1
        return self.step


class Driver:
    """``python -m jobs.train`` as a subprocess in its own session (so SIGKILL takes the whole driver)."""

    def __init__(self, world: World, argv: list[str], env: dict[str, str], log: Path):
        self.world, self.argv, self.env, self.log = world, argv, env, log
        self.proc: subprocess.Popen | None = None
        self.launches = 0

    def launch(self) -> None:
        self.launches += 1
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "jobs.train", *self.argv], cwd=ROOT, env=self.env,
                                         stdout=log, stderr=log, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None


# ------------------------------------------------------------------------------------------------ separate hosts


class SimMlflow:
    """The sim's ``mlflow server`` (tracking.server, which execs it, in the services namespace: cluster/sim.py
    ``_services``), stopped by its process group and started again with the same command line and environment."""

    def __init__(self, sim: Any):
        self.sim, self.uri = sim, sim.mlflow_uri
        self.pid = self._find()
        self.argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        env = Path(f"/proc/{self.pid}/environ").read_bytes().decode(errors="replace").split("\0")
        self.env = dict(e.split("=", 1) for e in env if "=" in e)
        self.log = Path(sim.state) / "logs" / "mlflow.log"

    def _find(self) -> int:
        from cluster import sim as simulator

        for pid in sorted(simulator.ns_pids(self.sim.services_ns)):  # the server's first process: its leader
            try:
                if b"\0mlflow\0server\0" in Path(f"/proc/{pid}/cmdline").read_bytes():  # tracking.server execs it
                    self.pgid = os.getpgid(pid)
                    return pid
            except OSError:
                continue
        raise RuntimeError("cluster.sim: no `mlflow server` process in the services namespace")

    @property
    def running(self) -> bool:
        try:
            os.killpg(self.pgid, 0)
            return True
        except OSError:
            return False

    def healthy(self) -> bool:
        from cluster import sim as simulator

        return simulator._http_ok(f"{self.uri}/health")

    def stop(self) -> None:
        """SIGTERM to the server's process group (it leads its session), SIGKILL after 10 s; bounded."""
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                return
            if wait_until(lambda: not self.running, wait_s, poll=0.1):
                return

    def start(self) -> None:
        from cluster import sim as simulator

        self.pid = self.pgid = simulator.spawn(["ip", "netns", "exec", self.sim.services_ns, *self.argv], self.env,
                                               self.log)  # its own session: the pid leads its group
        wait_until(self.healthy, 180, poll=0.25)


class HostsDriver(Driver):
    """The job submitted from the laptop with ``ray job submit`` to the head's dashboard (tests/hosts); killed with
    ``ray job stop`` (SIGTERM to the driver, SIGKILL 3 s later) and submitted again under a new submission id."""

    def __init__(self, world: HostsWorld, name: str, argv: list[str], runtime_env: dict, log: Path):
        super().__init__(world, argv, world.laptop_env(), log)
        self.name, self.runtime_env = name, runtime_env

    def _ray(self, *args: str) -> list[str]:
        return [str(Path(sys.executable).with_name("ray")), "job", *args]

    @property
    def submission_id(self) -> str:
        return f"{self.name}-{self.launches}"

    def launch(self) -> None:
        self.launches += 1
        argv = self._ray("submit", "--submission-id", self.submission_id, "--working-dir", str(ROOT),
                         "--runtime-env-json", json.dumps(self.runtime_env), "--", "python", "-m", "jobs.train",
                         *self.argv)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with open(self.log, "ab") as log:
                subprocess.run(self._ray("stop", self.submission_id), cwd=ROOT, env=self.env, stdout=log,
                               stderr=log, timeout=90, check=False)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


@dataclass
class HostsWorld(World):
    """The campaign on separate hosts: a ``cluster.sim`` cluster of a head (0 CPUs) and two worker hosts (1 CPU
    each), each a network namespace with its own address and ``/tmp``; S3 (moto) and ``mlflow server`` on the
    bridge; jobs from the laptop with ``ray job submit``; checkpoints in ``s3://sim/runs``. ``home`` is under the
    sim's state folder (every host sees it, like an NFS mount): traces, markers and summaries go there."""

    sim: Any = None
    down_hosts: set[int] = field(default_factory=set)

    @classmethod
    def start(cls, home: Path | None = None, nodes: int = 2, bridge: str = "etchaos0",
              subnet: str = "198.18.5", gcs_ft: bool = False) -> HostsWorld:
        from cluster import sim as simulator

        quiet = lambda *_: None  # noqa: E731
        simulator.down(bridge=bridge, say=quiet)  # what a killed earlier campaign left
        sim = simulator.up(1 + nodes, bridge=bridge, subnet=subnet, worker_cpus=1, head_cpus=0, gcs_ft=gcs_ft,
                           say=quiet)
        try:
            home = Path(sim.state) / "campaign"
            home.mkdir(parents=True)
            return cls(home, None, SimMlflow(sim), sim=sim)
        except BaseException:
            simulator.down(sim, say=quiet)
            raise

    def stop(self) -> None:
        from cluster import sim as simulator

        simulator.down(self.sim, say=lambda *_: None)

    def worker_nodes(self) -> list[Any]:
        return self.sim.hosts[1:]

    def laptop_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "AWS_", "MLFLOW_", "ELASTIC_TRAIN_"))}
        env.update({k: v for k, v in self.sim.laptop_env().items() if k.startswith("RAY_")})
        return env

    def job_argv(self, name: str, epochs: int, workers: int, every: int, trace: Path | None,
                 summary: Path) -> list[str]:
        argv = job_argv(self, name, epochs, workers, every, trace, summary)
        argv[1] = "configs/digits.yaml"  # the working dir the job runs in
        return [a for a in argv if not a.startswith("checkpoint.storage_path=")] + [
            "checkpoint.storage_path=s3://sim/runs", "scaling.placement_strategy=STRICT_SPREAD"]

    def driver(self, name: str, argv: list[str], spec: str | None, log: Path) -> Driver:
        env = {**self.sim.job_env(), "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
               "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": "0.5"}
        if spec:
            env["ELASTIC_TRAIN_FAULT"] = spec
        return HostsDriver(self, name, argv, {"env_vars": env}, log)

    def victim(self, trace: Path) -> int:
        """The worker host of rank 0 now (its metrics sender goes with it), from the trace's last line's pid;
        the first worker host that is up when that pid is on none."""
        from cluster import sim as simulator

        path, pid = Path(f"{trace}.rank0"), None
        if path.exists():
            with open(path, "rb") as f:
                f.seek(max(0, path.stat().st_size - 4096))
                lines = [x for x in f.read().decode(errors="replace").splitlines()[1:] if x.strip()]
            with_pid = [json.loads(x) for x in lines if '"pid"' in x]
            pid = with_pid[-1]["pid"] if with_pid else None
        host = simulator.host_of_pid(self.sim, pid) if pid else None
        if host in (None, 0) or host in self.down_hosts:
            host = next(h.index for h in self.sim.hosts[1:] if h.index not in self.down_hosts)
        return host

    def kill_host(self, index: int) -> int:
        from cluster import sim as simulator

        self.down_hosts.add(index)
        return simulator.kill(self.sim, index)

    def partition(self, index: int) -> None:
        from cluster import sim as simulator

        self.down_hosts.add(index)
        simulator.partition(self.sim, index)

    def heal(self, index: int) -> float | None:
        """The link up again: the healed raylet exits by itself ("marked dead") and the host's ``add-worker.sh
        --rejoin`` supervisor joins it again as a new node. Returns how long until the host was alive again."""
        from cluster import sim as simulator

        simulator.heal(self.sim, index)
        t = time.monotonic()
        ip = self.sim.hosts[index].ip
        if not wait_until(lambda: ip in {n.get("node_ip") for n in simulator.alive_nodes(self.sim)}, 120, poll=0.5):
            simulator.kill(self.sim, index)  # not back by itself (a problem the report names): join it as before
            self.add_back({"host": index})
            return None
        self.down_hosts.discard(index)
        return round(time.monotonic() - t, 2)

    def lose_head(self, driver: HostsDriver) -> dict:
        """Head loss, and what a platform does about it: every process of host 0 SIGKILLed; once the laptop's job
        client has seen it, a new head on the same address (with the same Redis when the sim has one); the worker
        hosts alive in Ray again; the job submitted again under the same run name. Returns the phases, seconds
        from the kill (None: not within its bound)."""
        from cluster import sim as simulator

        t0 = time.monotonic()
        since = lambda: round(time.monotonic() - t0, 2)  # noqa: E731
        out: dict[str, Any] = {"processes_killed": simulator.kill(self.sim, 0)}
        out["detection_s"] = since() if wait_until(lambda: driver.poll() is not None, 60, poll=0.1) else None
        if driver.poll() is None:  # a client that never noticed (not seen): its process group
            os.killpg(driver.proc.pid, signal.SIGKILL)
            driver.proc.wait(timeout=30)
        simulator.restart_head(self.sim)
        out["head_back_s"] = since()
        workers = {h.ip for h in self.sim.hosts[1:]}
        back = wait_until(lambda: workers <= {n.get("node_ip") for n in simulator.alive_nodes(self.sim)}, 180, 0.5)
        out["workers_back_s"] = since() if back else None
        self.wait_cpus_free()
        driver.launch()
        out.update(resubmitted_s=since(), relaunched_unix=time.time())
        return out

    def add_back(self, ev: dict) -> None:
        from cluster import sim as simulator

        ip = self.sim.hosts[ev["host"]].ip  # join counts alive nodes: the old one must be dead first
        wait_until(lambda: ip not in {n.get("node_ip") for n in simulator.alive_nodes(self.sim)}, 90, poll=0.5)
        simulator.join(self.sim, ev["host"])
        self.down_hosts.discard(ev["host"])

    def wait_cpus_free(self, timeout_s: float = 60) -> bool:
        """Until no Ray Train worker or controller actor of an earlier driver is alive (state API), bounded; Ray
        Train's detached TrainStateActor stays for the cluster's life."""
        from cluster import sim as simulator

        def free() -> bool:
            code, body = simulator._api(self.sim, "/api/v0/actors?limit=1000&filter_keys=state"
                                                  "&filter_predicates=%3D&filter_values=ALIVE")
            if code != 200 or not isinstance(body, dict):
                return False
            actors = body["data"]["result"]["result"]
            return not any(a.get("class_name") in ("RayTrainWorker", "TrainController") for a in actors)

        return wait_until(free, timeout_s, poll=0.5)


def drain_for_preemption(address: str, node_id: str, deadline_s: int) -> tuple[bool, str]:
    """Ray's drain API (the GCS ``DrainNode`` call the autoscaler uses for spot reclaims)."""
    import ray
    from ray.core.generated import autoscaler_pb2

    gcs = ray._raylet.GcsClient(address=address)
    return gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                          "spot reclaim (chaos)", int(time.time() * 1000) + deadline_s * 1000)


def wait_until(predicate, timeout_s: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


# ------------------------------------------------------------------------------------------------ one run


def job_argv(world: World, name: str, epochs: int, workers: int, every: int, trace: Path | None,
             summary: Path) -> list[str]:
    argv = ["--config", str(ROOT / "configs/digits.yaml"), f"name={name}", f"train.epochs={epochs}",
            "tracking.system_metrics=false", "tracking.log_every_steps=1", "data.loader_workers=0",
            f"tracking.uri={world.mlflow.uri}", f"checkpoint.storage_path={world.home / 'results'}",
            f"scaling.num_workers=[1,{workers}]", "scaling.resize_check_interval_s=1",
            "failure.worker_start_timeout_s=30", f"checkpoint.every_steps={every}", "checkpoint.every_seconds=null",
            "failure.max_failures=-1", "--summary-json", str(summary)]
    return argv + ([f"data.trace_path={trace}"] if trace else [])


def job_env(world: World, spec: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ELASTIC_TRAIN_FAULT", "MLFLOW_TRACKING_URI")}
    env.update(RAY_ADDRESS=world.cluster.address, ELASTIC_TRAIN_HOME=str(world.home), RAY_USAGE_STATS_ENABLED="0",
               RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2"),
               RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S="0.5", PYTHONPATH=str(ROOT))
    if spec:
        env["ELASTIC_TRAIN_FAULT"] = spec
    return env


def reference(world: World, epochs: int, workers: int, every: int, timeout_s: float = 600) -> dict:
    """The fault-free run of the same config (same cluster, same server)."""
    name = f"clean-e{epochs}-w{workers}-c{every}"
    out = world.home / f"{name}.json"
    if out.exists():
        return json.loads(out.read_text())
    world.wait_cpus_free()
    driver = world.driver(name, world.job_argv(name, epochs, workers, every, None, out), None,
                          world.home / f"{name}.log")
    driver.launch()
    if not wait_until(lambda: driver.poll() is not None, timeout_s, poll=0.5):
        driver.kill()
    summary = json.loads(out.read_text()) if out.exists() else {"status": "NO SUMMARY"}
    summary["exit_code"] = driver.poll()
    return summary


def chaos_run(world: World, name: str, schedule: list[dict], epochs: int, workers: int, every: int, delay: float,
              timeout_s: float = 900) -> tuple[dict, list[dict], Path]:
    """Run the faulted job to its end while firing the campaign's faults; returns the summary, the campaign
    events (one per campaign fault: fired step and time, plus what followed) and the run's folder."""
    run_home = world.home / name
    run_home.mkdir()
    markers, trace, out = run_home / "markers", run_home / "trace", run_home / "summary.json"
    driver = world.driver(name, world.job_argv(name, epochs, workers, every, trace, out),
                          fault_spec(schedule, markers, delay), run_home / "driver.log")
    progress = Progress(trace)
    last_readd = epochs * STEPS_PER_EPOCH - 2
    # actions: (step, order, what, fault index); a window's end is queued when its start fires
    actions = [(f["step"], 0, f["kind"], i) for i, f in enumerate(schedule) if f["kind"] in CAMPAIGN_KINDS]
    events: dict[int, dict] = {}
    draining: dict[int, tuple] = {}  # drains awaiting their just-in-time checkpoint: fault index -> (node, until)
    cut: dict[int, float] = {}  # partitions: fault index -> when the link comes up again (monotonic)
    world.wait_cpus_free()
    t0 = time.time()
    driver.launch()
    deadline = time.monotonic() + timeout_s
    while driver.poll() is None:
        if time.monotonic() > deadline:
            driver.kill()
            raise RuntimeError(f"campaign {name}: the run did not end within {timeout_s:g} s (see {driver.log})")
        step = progress.poll()
        due = sorted(a for a in actions if a[0] <= step)
        for a in due:
            actions.remove(a)
            _, _, what, i = a
            ev = events.setdefault(i, {})
            if what in ("host", "partition") and (cut or getattr(world, "down_hosts", None)):
                actions.append((step + 1, 0, what, i))  # one worker host away at a time: the other trains
                continue
            if what == "head":
                if cut or world.down_hosts:  # both worker hosts in: each rejoin is the new head's
                    actions.append((step + 1, 0, what, i))
                    continue
                ev.update(fired=True, fired_step=step, unix=time.time())
                ev.update(world.lose_head(driver))
                continue
            if what in ("host", "partition"):
                victim = world.victim(trace)
                ev.update(fired=True, fired_step=step, unix=time.time(), host=victim)
                if what == "host":  # every process of the host SIGKILLed at once; it joins again a few steps later
                    ev["processes_killed"] = world.kill_host(victim)
                    actions.append(_readd_action(i, step, schedule, events, last_readd))
                else:  # the link down for down_s, then up: the host joins again by itself (--rejoin)
                    world.partition(victim)
                    cut[i] = time.monotonic() + schedule[i]["down_s"]
                continue
            if what in ("node", "drain"):
                nodes = world.worker_nodes()
                if not nodes:  # nothing to take away now: try again at the next step
                    actions.append((step + 1, 0, what, i))
                    continue
                ev.update(fired=True, fired_step=step, unix=time.time())
                if what == "drain":
                    ok, msg = drain_for_preemption(world.cluster.address, nodes[0].node_id, deadline_s=30)
                    ev["drain_accepted"] = bool(ok)
                    # the node goes once the just-in-time checkpoint is there (or 30 s, or the run nears its
                    # end); meanwhile the loop goes on firing the other faults when they are due
                    draining[i] = (nodes[0], time.monotonic() + 30 if ok else 0.0)
                    continue
                world.cluster.remove_node(nodes[0])
                actions.append(_readd_action(i, progress.poll(), schedule, events, last_readd))
            elif what == "readd":
                world.add_back(ev)
                ev.update(readded_step=step, readded_unix=time.time())
            elif what == "driver":
                ev.update(fired=True, fired_step=step, unix=time.time())
                driver.kill()
                if not world.mlflow.healthy():  # a resumed driver needs its tracking server (exit 2 without)
                    _ensure_server(world)
                world.wait_cpus_free()
                ev["relaunched_unix"] = time.time()
                driver.launch()
            elif what == "mlflow":  # stopped, and started again at once: the outage lasts one server start
                ev.update(fired=True, fired_step=step, unix=time.time())
                world.mlflow.stop()
                _ensure_server(world, wait=False)
                ev.update(restart_issued_unix=time.time())
        for i, until in list(cut.items()):
            if time.monotonic() >= until:
                del cut[i]
                _heal_and_rejoin(world, events[i], progress.poll())
        for i, (node, until) in list(draining.items()):
            jit = _preemption_checkpoint(run_home)
            if jit or time.monotonic() > until or progress.poll() >= last_readd - 1:
                del draining[i]
                events[i].update(jit_checkpoint=jit, removed_unix=time.time())
                world.cluster.remove_node(node)
                actions.append(_readd_action(i, progress.poll(), schedule, events, last_readd))
        for ev in events.values():
            if "restart_issued_unix" in ev and "back_unix" not in ev and world.mlflow.healthy():
                ev.update(back_unix=time.time(), back_step=progress.poll())
        time.sleep(0.05)
    rc = driver.poll()
    for i in cut:  # a partition the run outlived: healed and joined now
        _heal_and_rejoin(world, events[i], progress.poll())
        events[i]["healed_after_end"] = True
    if not world.mlflow.healthy():
        _ensure_server(world)
    for i, (node, _) in draining.items():  # a drain the run outlived: its node goes now and comes back below
        events[i].update(jit_checkpoint=_preemption_checkpoint(run_home), removed_unix=time.time(),
                         removed_after_end=True)
        world.cluster.remove_node(node)
        actions.append(_readd_action(i, progress.poll(), schedule, events, last_readd))
    for a in actions:  # windows still open when the run ended: close them (a node back, the server up)
        if a[2] == "readd":
            world.add_back(events[a[3]])
            events[a[3]]["readded_after_end"] = True
    summary = json.loads(out.read_text()) if out.exists() else {"status": "NO SUMMARY"}
    summary.update(exit_code=rc, chaos_wall_s=round(time.time() - t0, 1), driver_launches=driver.launches)
    for ev in events.values():
        ev["t_s"] = round(ev["unix"] - t0, 2) if "unix" in ev else None
    for ev in events.values():
        if "readded_unix" in ev:
            ev["grown_after_s"] = _grown_after(trace, ev["readded_unix"])
        if "back_unix" in ev:  # from the stop to the first answer of the restarted server
            ev["outage_s"] = round(ev["back_unix"] - ev["unix"], 2)
    return summary, [events.get(i, {}) for i in range(len(schedule))], run_home


def _heal_and_rejoin(world: HostsWorld, ev: dict, step: int) -> None:
    ev.update(healed_unix=time.time(), healed_step=step)
    ev["rejoined_s"] = world.heal(ev["host"])
    ev.update(readded_step=step, readded_unix=time.time())


def _ensure_server(world: World, wait: bool = True) -> None:
    if not world.mlflow.running:
        if wait:
            world.mlflow.start()
        else:
            import threading

            threading.Thread(target=world.mlflow.start, daemon=True).start()
            wait_until(lambda: world.mlflow.running, 10)
    elif wait:
        wait_until(world.mlflow.healthy, 90, poll=0.2)


def _readd_action(i: int, removed_at: int, schedule: list[dict], events: dict[int, dict],
                  last_readd: int) -> tuple:
    """The node of fault ``i`` was removed at step ``removed_at``: the action that adds one back. The window counts
    from the removal (a drain waited for its checkpoint), but the node comes back while the run still trains: a
    removal that came late gets its node back at once near the end, not after the run."""
    events[i]["removed_step"] = removed_at
    due = min(removed_at + schedule[i]["until"] - schedule[i]["step"], last_readd)
    return (due, 1, "readd", i)


def _preemption_checkpoint(run_home: Path) -> bool:
    for meta in (run_home.parent / "results" / run_home.name).glob("checkpoint_*/meta.json"):
        try:
            if json.loads(meta.read_text()).get("reason") == "preemption":
                return True
        except (OSError, ValueError):
            pass
    return False


def _grown_after(trace: Path, since: float) -> float | None:
    """Seconds from a node's return to the first step served by a bigger group than just before it."""
    from tests.helpers.trace import read_trace

    records = sorted((r for r in read_trace(trace) if "epoch" in r), key=lambda r: r["t"])
    before = [r["world_size"] for r in records if r["t"] <= since]
    base = before[-1] if before else None
    grown = next((r["t"] for r in records if r["t"] > since and base is not None and r["world_size"] > base), None)
    return round(grown - since, 2) if grown else None


# ------------------------------------------------------------------------------------------------ the report


def read_jsonl(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


def analyse(schedule: list[dict], events: list[dict], markers: Path) -> list[dict]:
    """One row per scheduled fault: fired where and when, detection, and the recovery that followed it (rank 0's
    first attempt entered after it and before the next fault)."""
    fired = {}  # worker-fault index -> marker record
    for p in markers.glob("fault-*.json"):
        fired[int(p.stem.split("-")[1])] = json.loads(p.read_text())
    rows, w = [], 0
    for i, f in enumerate(schedule):
        row = {"kind": f["kind"], "mode": f["mode"], "scheduled_step": f["step"], "fired": False}
        if f["kind"] in WORKER_KINDS:
            row["rank"] = f["rank"]
            rec = fired.get(w)
            w += 1
            if rec is not None:
                row.update(fired=True, fired_step=rec["step"], unix=rec["unix"], detection_s=None)
        else:
            ev = events[i]
            row.update({k: v for k, v in ev.items() if not k.endswith("_unix")})
            if ev.get("fired") and f["kind"] != "head":  # head: the job client's end, measured (lose_head)
                row["detection_s"] = None if f["kind"] in ("host", "partition") else 0.0
            if "down_s" in f:
                row["down_s"] = f["down_s"]
        rows.append(row)
    times = sorted(r["unix"] for r in rows if r.get("fired") and r["kind"] != "mlflow")  # faults that restart
    for row in rows:
        if row.get("fired") and row["kind"] != "mlflow":
            later = [t for t in times if t > row["unix"]]
            row.update(recovery_phases(row, markers, until=later[0] if later else None) or {})
            if row.get("detection_s") is None and "ray_train_phases_s" in row:
                row["detection_s"] = row["ray_train_phases_s"]["detection_s"]
            if row.get("detection_s") is None and row["kind"] in ("host", "partition"):
                row["detection_s"] = failure_decision_after(markers, row["unix"])
        elif row.get("fired"):
            row["steps_lost"] = 0  # training went on; the metrics waited in rank 0's sender
    return rows


def failure_decision_after(markers: Path, unix: float) -> float | None:
    """Seconds from ``unix`` (a host lost or cut off) to the Train controller's next failure decision."""
    path = markers / "controller.jsonl"
    if not path.exists():
        return None
    t = next((e["unix"] for e in read_jsonl([path]) if e["event"] == "failure_decision" and e["unix"] >= unix), None)
    return round(t - unix, 2) if t is not None else None


def by_kind(rows: list[dict]) -> dict:
    """Per fault kind: how many fired, mean detection and recovery, and the mean of each recovery phase."""
    out = {}
    for kind in sorted({r["kind"] for r in rows if r.get("fired")}):
        rs = [r for r in rows if r["kind"] == kind and r.get("fired")]

        def mean(values: list) -> float | None:
            values = [v for v in values if v is not None]
            return round(statistics.mean(values), 2) if values else None

        phases = {}
        for key in ("phases_s", "ray_train_phases_s"):
            names = sorted({n for r in rs for n in r.get(key, {})})
            if names:
                phases[key] = {n: mean([r.get(key, {}).get(n) for r in rs]) for n in names}
        out[kind] = {"fired": len(rs), "mean_detection_s": mean([r.get("detection_s") for r in rs]),
                     "worst_detection_s": max((r["detection_s"] for r in rs if r.get("detection_s") is not None),
                                              default=None),
                     "mean_recovery_s": mean([r.get("recovery_s") for r in rs]),
                     "worst_recovery_s": max((r["recovery_s"] for r in rs if r.get("recovery_s") is not None),
                                             default=None), **phases}
        if kind == "partition":  # from the heal to the host alive again, joined by its --rejoin supervisor
            out[kind]["mean_rejoined_s"] = mean([r.get("rejoined_s") for r in rs])
        if kind == "head":  # seconds from the kill (HostsWorld.lose_head)
            for phase in ("head_back_s", "workers_back_s", "resubmitted_s"):
                out[kind][f"mean_{phase}"] = mean([r.get(phase) for r in rs])
    return out


def recovery_phases(fault: dict, markers: Path, until: float | None = None) -> dict | None:
    """The recovery after ``fault`` (``unix``, ``fired_step``): rank 0's next attempt noted in
    ``markers/phases.rank0.jsonl`` (entered before ``until``), split into phases; None when none followed."""
    by_pid: dict[int, dict[str, dict]] = {}
    for r in read_jsonl(sorted(markers.glob("phases.rank0.jsonl"))):
        by_pid.setdefault(r["pid"], {})[r["event"]] = r
    attempts = sorted((a for a in by_pid.values() if "entered" in a), key=lambda a: a["entered"]["at"])
    a = next((a for a in attempts if a["entered"]["at"] > fault["unix"] and "first_step" in a
              and (until is None or a["entered"]["at"] < until)), None)
    if a is None:
        return None
    entered = a["entered"]
    start = max(entered.get("process_start") or entered["at"], fault["unix"])
    built, first = a["built"]["unix"], a["first_step"]["unix"]
    restored = a.get("restored", a["built"])["unix"]
    out = {"recovery_s": round(first - fault["unix"], 2),
           "steps_lost": max(0, fault["fired_step"] - (a["first_step"]["step"] - 1)),
           "phases_s": {"ray_restart_s": round(start - fault["unix"], 2),
                        "worker_setup_s": round(entered["at"] - start, 2),
                        "build_s": round(built - entered["at"], 2), "restore_s": round(restored - built, 2),
                        "first_step_s": round(first - restored, 2)}}
    split = ray_train_phases(fault["unix"], a, markers)
    if split is not None:
        out["ray_train_phases_s"] = split
    return out


def ray_train_phases(fault_unix: float, attempt: dict[str, dict], markers: Path) -> dict | None:
    """``ray_restart_s`` + ``worker_setup_s`` split at the Train controller's events (``controller.jsonl``,
    launch/controller.RestartPhases) and the new rank 0's ``context`` (train/warmup.py): detection (the fault ->
    the controller's failure decision), teardown (-> the old group shut down), placement (-> the new worker
    process started: placement group, actor scheduling, process spawn), process start (-> its train context:
    interpreter, Ray, the worker actor), process group (-> the group ready: torch's rendezvous) and dispatch (->
    our function entered). None when an event is missing (a driver restart: another controller)."""
    path = markers / "controller.jsonl"
    if not path.exists() or "context" not in attempt:
        return None
    events = [e for e in read_jsonl([path]) if e["unix"] >= fault_unix]
    entered, context = attempt["entered"], attempt["context"]

    def after(name: str, t: float | None) -> float | None:
        return None if t is None else next((e["unix"] for e in events if e["event"] == name and e["unix"] >= t), None)

    decided = after("failure_decision", fault_unix)
    down = after("shutdown_done", decided)
    started = context.get("process_start") or entered.get("process_start")
    if started is not None and down is not None and started < down:  # a warm spare (train/spares.py), made
        started = down  # before the fault: placement is then only the actor's scheduling onto it
    ready = after("group_ready", context["unix"])
    points = [fault_unix, decided, down, started, context["unix"], ready, entered["at"]]
    if any(p is None for p in points) or any(b < a for a, b in zip(points, points[1:], strict=False)):
        return None
    names = ["detection_s", "teardown_s", "placement_s", "process_start_s", "process_group_s", "dispatch_s"]
    return {n: round(b - a, 2) for n, a, b in zip(names, points, points[1:], strict=False)}


def wait_for_senders(world: World, name: str, run_id: str | None) -> float | None:
    """Seconds until no metrics sender of the run is left (one still sending after the driver ended: MLflow was
    away at the end; tracking/fence.py), bounded; None when one still holds the run's lock after the bound."""
    from tracking.fence import SenderFence, lock_path

    if not run_id:
        return None
    t0, fence = time.monotonic(), SenderFence(lock_path(world.home / "results" / name / "mlflow_unsent.jsonl", run_id))
    done = fence.acquire()
    fence.release()
    return round(time.monotonic() - t0, 1) if done else None


def mlflow_checks(summary: dict, name: str) -> dict:
    """One MLflow run named ``name``; every step's ``train_loss`` once; status FINISHED; ``restarts`` right."""
    try:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=summary["tracking_uri"])
        exp = client.get_experiment_by_name("elastic-train")
        runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`elastic_train.run_name` = '{name}'")
        steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], "train_loss")]
        restarts = client.get_metric_history(summary["mlflow_run_id"], "restarts")
    except Exception as e:  # reported
        return {"mlflow_error": f"{type(e).__name__}: {e}"}
    want = set(range(1, (summary.get("steps") or 0) + 1))
    return {"mlflow_runs": len(runs), "mlflow_status": runs[0].info.status if runs else None,
            "metric_steps_missing": sorted(want - set(steps))[:20],
            "metric_steps_repeated": sorted({s for s in steps if steps.count(s) > 1})[:20],
            "metrics_once_in_mlflow": bool(steps) and sorted(steps) == sorted(want),
            "mlflow_restarts": restarts[-1].value if restarts else None}


def wall_adds_up(summary: dict) -> bool:
    from elastic_train.train.goodput import WALL_PARTS

    g, wall = summary.get("goodput") or {}, summary.get("wall_s")
    return bool(g) and wall is not None and abs(sum(g.get(k, 0) for k in WALL_PARTS) - wall) <= 0.05 \
        and all(g.get(k, 0) >= 0 for k in WALL_PARTS)


def campaign(world: World, seed: int, n_faults: int, epochs: int, workers: int, every: int, delay: float,
             kinds: tuple[str, ...] = KINDS, name: str | None = None, timeout_s: float = 900) -> dict:
    """One seeded campaign on ``world`` against the fault-free reference; the JSON report."""
    from tests.helpers.trace import exactly_once_problems, read_trace

    total = epochs * STEPS_PER_EPOCH
    schedule = draw_schedule(seed, n_faults, total, every, workers, kinds)
    t0 = time.time()
    clean = reference(world, epochs, workers, every, timeout_s=timeout_s)
    t1 = time.time()
    name = name or f"{NAME}-s{seed}"
    chaos, events, run_home = chaos_run(world, name, schedule, epochs, workers, every, delay, timeout_s=timeout_s)
    rows = analyse(schedule, events, run_home / "markers")
    problems = exactly_once_problems(read_trace(run_home / "trace"), N_TRAIN, GLOBAL_BATCH, epochs)
    recoveries = [r["recovery_s"] for r in rows if "recovery_s" in r]
    same_world = chaos.get("world_sizes") == [workers] and clean.get("world_sizes") == [workers]
    a, b = (s.get("final_metrics", {}).get("train_loss") for s in (chaos, clean))
    injected = sum(r["fired"] for r in rows)
    finished = chaos.get("status") == "FINISHED"
    senders_done = None if isinstance(world, HostsWorld) else wait_for_senders(world, name, chaos.get("mlflow_run_id"))
    tracked = mlflow_checks(chaos, name) if "mlflow_run_id" in chaos else {"mlflow_error": "no summary"}
    for r in rows:
        r.pop("unix", None)
    return {
        "benchmark": "chaos", "seed": seed, "workers": f"[1,{workers}]", "epochs": epochs, "steps": total,
        "checkpoint_every_steps": every, "step_delay_s": delay, "nodes": 1 + len(world.worker_nodes()),
        "measured_under": "load (shared 2-core box)", "faults": rows,
        "hosts": isinstance(world, HostsWorld), "by_kind": by_kind(rows),
        "totals": {
            "scheduled": len(schedule), "injected": injected, "survived": injected if finished else 0,
            "kinds": sorted({r["kind"] for r in rows if r["fired"]}),
            "status": chaos.get("status"), "exit_code": chaos.get("exit_code"), "error": chaos.get("error"),
            "driver_launches": chaos.get("driver_launches"),
            "restarts": chaos.get("restarts"), "world_sizes": chaos.get("world_sizes"),
            "exactly_once": not problems, "samples_lost": 0 if not problems else None,
            "trace_problems": problems[:10],
            "mean_recovery_s": round(statistics.mean(recoveries), 2) if recoveries else None,
            "worst_recovery_s": round(max(recoveries), 2) if recoveries else None,
            "steps_lost": sum(r.get("steps_lost", 0) for r in rows),
            "recomputed_steps_ledger": (chaos.get("goodput") or {}).get("recomputed_steps"),
            "restart_lost_s_ledger": (chaos.get("goodput") or {}).get("restart_lost_s"),
            "goodput_parts_sum_to_wall": wall_adds_up(chaos), "goodput": chaos.get("goodput"),
            **tracked, "senders_done_s": senders_done,
            "tracking_error": chaos.get("tracking_error"), "tracking_unsent": chaos.get("tracking_unsent"),
            "params_sha256": chaos.get("params_sha256"), "clean_params_sha256": clean.get("params_sha256"),
            "world_size_never_changed": same_world,
            "params_bitwise_equal": chaos.get("params_sha256") == clean.get("params_sha256") if same_world else None,
            "train_loss_rel_diff": abs(a - b) / abs(b) if a is not None and b else None,
            "startup": chaos.get("startup"), "teardown": chaos.get("teardown"),
            "clean_wall_s": round(t1 - t0, 1), "chaos_wall_s": chaos.get("chaos_wall_s"),
        },
    }


def passed(report: dict) -> list[str]:
    """What the end checks found wrong ([] when the campaign passed)."""
    t, bad = report["totals"], []
    if t["status"] != "FINISHED":
        bad.append(f"status {t['status']} ({t.get('error')})")
    if t["injected"] != t["scheduled"]:
        bad.append(f"{t['injected']} of {t['scheduled']} faults fired")
    if not t["exactly_once"]:
        bad.append(f"sample trace: {t['trace_problems'][:3]}")
    if t["world_size_never_changed"] and not t["params_bitwise_equal"]:
        bad.append("params_sha256 differs from the fault-free run's at the same world size")
    if t["train_loss_rel_diff"] is None or t["train_loss_rel_diff"] >= 1e-4:
        bad.append(f"train loss differs by {t['train_loss_rel_diff']} relative")
    if t.get("mlflow_runs") != 1 or t.get("mlflow_status") != "FINISHED" or not t.get("metrics_once_in_mlflow"):
        bad.append(f"mlflow: runs {t.get('mlflow_runs')}, status {t.get('mlflow_status')}, missing "
                   f"{t.get('metric_steps_missing')}, repeated {t.get('metric_steps_repeated')} "
                   f"{t.get('mlflow_error') or ''}")
    if t.get("mlflow_restarts") != t["restarts"]:
        bad.append(f"mlflow restarts {t.get('mlflow_restarts')} != summary {t['restarts']}")
    if not t["goodput_parts_sum_to_wall"]:
        bad.append("goodput parts do not sum to wall")
    for row in report.get("faults", []):
        if row["kind"] == "head" and row.get("fired") and None in (row.get("detection_s"), row.get("workers_back_s")):
            bad.append(f"head loss at step {row.get('fired_step')}: the job client did not end within 60 s, or the "
                       "worker hosts were not back in Ray within 180 s of the new head")
        if row["kind"] == "partition" and row.get("fired") and row.get("rejoined_s") is None:
            bad.append(f"partition at step {row.get('fired_step')}: host {row.get('host')} did not rejoin by itself "
                       "within 120 s of the heal (add-worker.sh --rejoin)")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="N in scaling.num_workers=[1,N]")
    p.add_argument("--nodes", type=int, default=1, help="worker nodes besides the head (1 CPU each)")
    p.add_argument("--every", type=int, default=5, help="checkpoint.every_steps")
    p.add_argument("--delay", type=float, default=0.15, help="seconds each step is stretched by")
    p.add_argument("--kinds", help=f"comma-separated subset of {','.join(KINDS)} (--hosts: of {','.join(HOSTS_KINDS)})")
    p.add_argument("--hosts", action="store_true", help="on separate hosts: cluster.sim, a head and 2 worker hosts")
    p.add_argument("--bridge", default="etchaos0", help="--hosts: the sim's bridge (its own, apart from tests')")
    p.add_argument("--subnet", default="198.18.5", help="--hosts: the sim's /24 (of 198.18.0.0/15)")
    p.add_argument("--smoke", action="store_true", help="6 faults over 3 epochs")
    p.add_argument("--timeout", type=float, default=900, help="seconds each run (reference, faulted) may take")
    p.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (driver logs, traces, markers)")
    args = p.parse_args(argv)
    if args.smoke:
        args.faults, args.epochs = 6, 3
    allowed = HOSTS_KINDS if args.hosts else KINDS
    kinds = tuple(k for k in (args.kinds or ",".join(allowed)).split(",") if k)
    if unknown := set(kinds) - set(allowed):
        p.error(f"--kinds: {sorted(unknown)} not among {','.join(allowed)}{' (--hosts)' if args.hosts else ''}")
    if args.hosts:
        from cluster import sim as simulator

        if (why := simulator.namespaces_supported()) is not None:
            p.error(f"--hosts: separate hosts need network namespaces: {why}")
    with tempfile.TemporaryDirectory(prefix="et-chaos-") as tmp:
        if args.hosts:  # a head (0 CPUs) and 2 worker hosts; the run's files under the sim's state folder
            world = HostsWorld.start(nodes=2, bridge=args.bridge, subnet=args.subnet, gcs_ft="head" in kinds)
        else:
            world = World.start(Path(args.keep or tmp), nodes=args.nodes)
        try:
            report = campaign(world, args.seed, args.faults, args.epochs, args.workers, args.every, args.delay, kinds,
                              timeout_s=args.timeout)
        finally:
            world.stop()
    report["problems"] = passed(report)
    print(json.dumps(report, indent=2))
    return 0 if not report["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
