"""A training worker's own start-up, overlapped with Ray Train's (a Ray Train worker callback).

Ray Train starts a worker group in round trips from its controller: create the actors, initialise each one's
train context, form the torch process group (a rendezvous of every rank), then dispatch the training function.
After that, the first thing our function pays that is not ours to cut is torch's: the first
``DistributedDataParallel`` of a process (FSDP's ``fully_shard`` alike) imports ``torch._dynamo``, 1.4-2 s of
CPU on one core, every time a worker group (re)starts (bench/recovery.py, ``build_s``).

:class:`WorkerWarmup` runs on every worker as soon as its train context exists (``after_init_train_context``,
before the process group) and starts a daemon thread that imports the worker module and ``torch._dynamo``
while the process group forms and the function is dispatched. The training function's own imports then find
them done (or wait on Python's module lock for the thread to finish them; nothing is imported twice). Kept
light: each worker imports this module to unpickle the callback.

It leaves the process at Ray's niceness 15: the training function puts it at 0 (priority.py) once the worker
group is up. Doing that here, while Ray Train's own helpers start (its PreemptionWatcher actor: a new process
at 15 that watches for drained nodes), starved them on a 2-core machine: the watcher came up only after a
short run had ended, and a drain got no just-in-time checkpoint (tests/cluster/test_chaos.py, seed 12).

The same module holds the warm spares' two halves that need Ray (train/spares.py says how they work):
:func:`preload`, the Train workers' setup hook, and :class:`SpareKeeper`, which asks a node's raylet for them.

It also points gloo at the interface that holds this node's Ray address (``GLOO_SOCKET_IFNAME``, netif.py)
before the process group forms: on separate hosts whose hostname resolves to 127.0.0.1 a group cannot form
without it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from elastic_train.compat.ray_train import WorkerCallback
from elastic_train.train.priority import normal_priority
from elastic_train.train.spares import (
    KEEP_ALIVE_S,
    MARKER_ENV,
    RPC_TIMEOUT_S,
    WARM_DIR,
    forget_gone,
    local_workers,
    mark_warm,
    warm,
)

WARM_MODULES = ("elastic_train.train.worker", "torch._dynamo")  # in the order the training function needs them


class WorkerWarmup(WorkerCallback):
    """``markers``: the fault spec's ``markers=DIR`` (restart timing, bench/recovery.py): this worker notes when
    its train context came up (``context``, with the process start) in ``DIR/phases.rank<R>.jsonl``."""

    def __init__(self, markers: str | None = None):
        self.markers = markers

    def after_init_train_context(self) -> None:
        match_ray_threads()
        threading.Thread(target=warm_imports, name="elastic-train-warmup", daemon=True).start()
        bind_gloo_to_ray_interface()
        if self.markers:
            import os

            import ray.train

            from elastic_train.train.faults import append_marker
            from elastic_train.train.process_info import process_start_unix

            rank = ray.train.get_context().get_world_rank()
            append_marker(self.markers, f"phases.rank{rank}.jsonl", "context", pid=os.getpid(), rank=rank,
                          process_start=process_start_unix())


def match_ray_threads() -> None:
    """torch's intra-op threads as Ray set them for this actor (``OMP_NUM_THREADS`` = its CPUs, set when the actor
    is placed). A process that imported torch before that (a spare: :func:`preload`) would keep torch's default,
    one thread per core: more threads than the worker's CPUs, and other floating-point sums than a cold start."""
    import sys

    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0 and torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


def bind_gloo_to_ray_interface() -> None:
    """Before the process group forms: gloo binds to the interface of this node's Ray address (netif.py), not
    to whatever the hostname resolves to (127.0.0.1 on many hosts: a two-host group then cannot connect)."""
    import os

    import ray

    from elastic_train.train.netif import gloo_interface_env

    os.environ.update(gloo_interface_env(ray.util.get_node_ip_address(), dict(os.environ)))


def warm_imports(modules: tuple[str, ...] = WARM_MODULES) -> list[str]:
    """Import ``modules`` (a warm-up: a failure here is left for the training function to meet and report)."""
    import importlib

    done = []
    for name in modules:
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception:  # the real import, in the training function, raises it properly
            break
    return done


# ---------------------------------------------------------------------- warm spares (train/spares.py)

def preload() -> None:
    """Ray's setup hook in every Train worker process (and so in every spare), before it takes work: import
    Ray Train's torch backend (torch with it) here, then the training worker's modules on a thread. The first
    part every Train worker imports anyway before its process group forms, and it must be whole before
    anything else imports Ray Train (two threads importing it at once meet a half-initialised package); the
    thread's part loads while Ray Train forms the group (as :class:`WorkerWarmup` does). In a spare all of it is done
    long before it is used. Never raises: a failing hook makes Ray end the process, and the real imports
    report their own errors."""
    def rest() -> None:
        if warm_imports(WARM_MODULES) == list(WARM_MODULES):
            mark_warm()  # a spare says it is warm (its keeper counts it)

    if warm_imports(("ray.train.torch",)):
        threading.Thread(target=rest, name="elastic-train-preload", daemon=True).start()


class SpareKeeper:
    """A Train worker's keeper of its raylet's spares. :meth:`start` (after an attempt's first step) returns at
    once; a daemon thread waits ``after_s`` of training (a short run never pays for spares), then tops the
    spares up every :data:`CHECK_S`: it asks the raylet for one missing spare at a time and waits for it to
    appear (a raylet starts few processes at once and drops a prestart beyond that: asked again after 15 s), so
    that the next count is true. One keeper works per raylet at a time (a lock file named by the raylet's pid);
    the others skip that round. ``note``: the restart-phase marker writer (bench)."""

    CHECK_S = 30.0

    def __init__(self, setting: int | str, after_s: float = 0.0, note: Callable[..., None] | None = None):
        self.setting, self.after_s = setting, after_s
        self.note = note or (lambda *a, **k: None)
        self._started = False

    @classmethod
    def for_this_worker(cls, setting: int | str, after_s: float,
                        note: Callable[..., None] | None = None) -> SpareKeeper | None:
        """The keeper when spares are on (``failure.spare_workers``: a count per node, or ``auto``: one per
        training worker on it) and this is a Train worker made warm (the marker in its env); None otherwise."""
        if setting == 0 or MARKER_ENV not in os.environ or "RAY_RAYLET_PID" not in os.environ:
            return None
        return cls(setting, after_s, note)

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        threading.Thread(target=self._run, name="elastic-train-spares", daemon=True).start()

    def _run(self) -> None:
        import time

        time.sleep(self.after_s)
        while True:
            self._top_up_locked()
            time.sleep(self.CHECK_S)

    def _top_up_locked(self) -> None:
        import fcntl

        raylet = os.environ["RAY_RAYLET_PID"]
        try:
            WARM_DIR.mkdir(parents=True, exist_ok=True)
            with open(WARM_DIR / f"raylet-{raylet}.lock", "a") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return  # another worker of this raylet is topping up
                self._top_up(raylet)
        except Exception as e:  # spares only make a restart faster: a failure here costs nothing else
            import logging

            logging.getLogger(__name__).debug("spare workers not topped up: %s", e)
            self.note("spares_failed", error=f"{type(e).__name__}: {e}")

    def _top_up(self, raylet: str, wait_s: float = 15.0) -> None:
        import time

        import ray

        from elastic_train.compat.ray_core import prestart_workers

        rc = ray.get_runtime_context()
        job, marker = rc.get_job_id(), os.environ[MARKER_ENV]
        idle, busy = local_workers(job, marker, raylet)
        want = len(busy) if self.setting == "auto" else int(self.setting)
        requested = 0
        address = None
        while len(idle) < want and requested < 3 * want:  # a raylet starting too many at once drops a prestart
            if address is None:
                node = next(n for n in ray.nodes() if n["NodeID"] == rc.get_node_id())
                address = f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}"
            prestart_workers(address, job, rc.get_runtime_env_string(), 1, KEEP_ALIVE_S, RPC_TIMEOUT_S)
            requested += 1
            deadline, known = time.monotonic() + wait_s, set(idle)
            while not _connected(set(idle) - known) and time.monotonic() < deadline:
                time.sleep(0.25)  # until the raylet has started it (its count then includes it)
                idle, busy = local_workers(job, marker, raylet)
            for pid in set(idle) - known:  # Ray puts it at niceness 15: under training it would import for
                normal_priority(pid)  # as long as training runs, and a restart would wait for the rest
        forget_gone(set(idle) | set(busy))
        self.note("spares", want=want, idle=len(idle), warm=len(warm(idle)), requested=requested,
                  pids=",".join(map(str, idle)))


def _connected(pids: set[int]) -> bool:
    """Some of ``pids`` have connected to Ray (titled ``ray::IDLE``): Ray has set their niceness (15) by then,
    so ours comes after it."""
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::"):
                return True
        except OSError:
            continue
    return False
