"""Ray Train's torch backend driven from the Train controller without importing torch there (checked on Ray 2.60.0).

**Why.** Ray Train runs its controller in a new process for every run (every ``jobs.train``, every sweep trial).
To unpickle the run's ``TorchConfig`` that process imports ``ray.train.torch.config``, whose first line is
``import torch``: 1.65 s of the controller's 3.1 s of imports on an idle core (``python -X importtime``,
2026-12-06; 3.8 s for that one import on a busy 2-core box), before the controller can start the worker group.
The controller itself never touches a tensor: its half of the backend only picks the process group's backend,
asks worker 0 for an address, and tells every worker to join. The workers import torch anyway.

**What.** :class:`LightTorchConfig` is ``TorchConfig``'s three fields with a backend whose controller half is
Ray's ``_TorchBackend`` for the cases this engine runs (``gloo`` on CPUs, ``nccl`` on GPUs, ``env://``, Ray Train
V2's worker group), calling the *same* worker-side functions of ``ray.train.torch.config`` by name, imported in
the worker. Anything else (``tpu_dist``, ``hccl``, ``tcp://``, a V1 worker group) goes to Ray's own backend
unchanged, which imports torch as before. The canary (``tests/unit/test_compat.py``, :mod:`.registry`) pins the
source of each Ray method mirrored here, so a Ray upgrade that changes what the controller does fails loudly
rather than leaving this copy behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig
from ray.train.constants import DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S, TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S
from ray.train.v2._internal.util import TrainingFramework

TORCH_CONFIG = "ray.train.torch.config"
LIGHT_BACKENDS = ("gloo", "nccl")  # what this engine runs; the rest is Ray's own path


@dataclass
class LightTorchConfig(BackendConfig):
    """``ray.train.torch.TorchConfig`` (same fields, same defaults, same worker-side setup) whose module does
    not import torch. ``TorchTrainer(torch_config=LightTorchConfig())`` fills ``backend`` as for Ray's."""

    backend: str | None = None
    init_method: str = "env"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return _LightTorchBackend

    @property
    def train_func_context(self) -> type:
        return _TrainFuncContext

    @property
    def framework(self) -> TrainingFramework:
        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": self.init_method, "timeout_s": self.timeout_s}

    def ray_config(self) -> Any:
        """The same settings as Ray's own ``TorchConfig`` (imports torch)."""
        from ray.train.torch.config import TorchConfig

        return TorchConfig(backend=self.backend, init_method=self.init_method, timeout_s=self.timeout_s)


class _TrainFuncContext:
    """Ray's ``TorchConfigContextManager`` (sets the CUDA device), entered in the worker."""

    def __enter__(self) -> None:
        from ray.train.torch.config import TorchConfigContextManager

        self._inner = TorchConfigContextManager()
        self._inner.__enter__()

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._inner.__exit__(*exc))


def light(backend_config: Any, worker_group: Any) -> bool:
    """Whether the controller-side copy below covers this run; otherwise Ray's ``_TorchBackend`` runs it."""
    return (backend_config.backend in LIGHT_BACKENDS and backend_config.init_method == "env"
            and hasattr(worker_group, "get_worker_group_context"))  # Ray Train V2's group (V1's has none)


def _ray_backend() -> Backend:
    from ray.train.torch.config import _TorchBackend

    return _TorchBackend()


# Worker-side steps: Ray's own functions, looked up in the worker (which has torch) by name.
def _in_worker(function: str, /, **kwargs: Any) -> Any:
    import importlib

    return getattr(importlib.import_module(TORCH_CONFIG), function)(**kwargs)


def _address_and_port() -> tuple[str, int]:
    from ray.train._internal.utils import get_address_and_port

    return get_address_and_port()


def _set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class _LightTorchBackend(Backend):
    """The controller half of Ray 2.60's ``_TorchBackend`` for gloo / nccl over ``env://`` on a V2 worker group
    (``on_start``: the master address from worker 0, the distributed env vars, every rank's
    ``init_process_group``; ``on_shutdown``: the group destroyed within Ray's timeout; ``on_training_start``:
    nothing on V2)."""

    share_cuda_visible_devices: bool = True

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        if not light(backend_config, worker_group):
            return _ray_backend().on_start(worker_group, backend_config.ray_config())
        import ray

        master_addr, master_port = worker_group.execute_single(0, _address_and_port)
        worker_group.execute(_set_master, addr=master_addr, port=master_port)
        worker_group.execute(_in_worker, "_set_torch_distributed_env_vars")
        ray.get([worker_group.execute_single_async(
            i, _in_worker, "_setup_torch_process_group", backend=backend_config.backend, world_rank=i,
            world_size=len(worker_group), init_method="env://", timeout_s=backend_config.timeout_s,
        ) for i in range(len(worker_group))])

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        if not light(backend_config, worker_group):
            return _ray_backend().on_shutdown(worker_group, backend_config.ray_config())
        import logging

        import ray
        from ray.exceptions import GetTimeoutError

        futures = worker_group.execute_async(_in_worker, "_shutdown_torch",
                                             destroy_process_group=len(worker_group) > 1)
        timeout_s = int(os.environ.get(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                       DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S))
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logging.getLogger(TORCH_CONFIG).warning(
                f"Torch process group shutdown timed out after {timeout_s} seconds")

    def on_training_start(self, worker_group: Any, backend_config: Any) -> None:
        if not light(backend_config, worker_group):
            return _ray_backend().on_training_start(worker_group, backend_config.ray_config())
        return None
