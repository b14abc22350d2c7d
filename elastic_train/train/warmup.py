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

It also points gloo at the interface that holds this node's Ray address (``GLOO_SOCKET_IFNAME``, netif.py)
before the process group forms: on separate hosts whose hostname resolves to 127.0.0.1 a group cannot form
without it.
"""

from __future__ import annotations

import threading

from elastic_train.compat.ray_train import WorkerCallback

WARM_MODULES = ("elastic_train.train.worker", "torch._dynamo")  # in the order the training function needs them


class WorkerWarmup(WorkerCallback):
    """``markers``: the fault spec's ``markers=DIR`` (restart timing, bench/recovery.py): this worker notes when
    its train context came up (``context``, with the process start) in ``DIR/phases.rank<R>.jsonl``."""

    def __init__(self, markers: str | None = None):
        self.markers = markers

    def after_init_train_context(self) -> None:
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
