"""How the model is spread over the workers (``scaling.strategy``): DDP or FSDP, as strategy objects.

A strategy is built once per worker with :func:`make_strategy` and asked, never branched on:

    prepare(model, cfg, device)       wrap the built model for the current process group
    precision(name, device)           autocast and grad scaler (FSDP: a scaler whose inf checks are all-reduced)
    save(model, optimizer, dir, rank) this rank's part of the model (and, sharded, optimizer) files
    load(model, optimizer, dir, ...)  the reverse, into the current (re)built model
    model_state_dict(model)           the full weights (a collective when sharded: every rank calls it)
    optimizer_state_dict(optimizer)   for train_state.pt; None when sharded (the optimizer lives in dcp/)
    equal_eval_batches                whether every rank must run as many eval forwards (FSDP: each is a collective)

A checkpoint shows its strategy by its layout: ``model.pt`` written by rank 0 (DDP) or a ``dcp/`` folder of
every rank's shards (FSDP); :func:`saved_by` reads it back. A new strategy is one class here, one entry in
:data:`STRATEGIES` and its literal in ``ScalingConfig.strategy``. Torch only: no Ray, no MLflow.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from elastic_train.files import replace_atomically
from elastic_train.train.loop import Precision

if TYPE_CHECKING:  # pydantic-free at run time
    from elastic_train.config import JobConfig

MODEL = "model.pt"  # the unwrapped model's state_dict (replicated strategies; rank 0)
DCP_DIR = "dcp"  # model and optimizer shards, torch.distributed.checkpoint (sharded strategies; every rank)


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP's wrapper (models compile in place, ``nn.Module.compile``: no wrapper)."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary name, then rename: a crash never leaves a half-written file."""
    replace_atomically(path, lambda tmp: torch.save(obj, tmp))


def world_size() -> int:
    """Workers (one device each) in the default process group; 1 without one."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class Strategy(ABC):
    """How one worker holds the model and its part of a checkpoint."""

    name: ClassVar[str]  # the scaling.strategy literal
    sharded: ClassVar[bool]  # parameters and optimizer state split across ranks
    equal_eval_batches: ClassVar[bool]  # every rank runs the same number of eval forwards
    layout: ClassVar[str]  # the file or folder in a checkpoint that holds the weights

    @abstractmethod
    def prepare(self, model: nn.Module, cfg: JobConfig | Any, device: torch.device) -> nn.Module:
        """Move ``model`` to ``device`` and wrap it for the default process group."""

    def precision(self, name: str, device: torch.device) -> Precision:
        return Precision.create(name, device, sharded=self.sharded)

    @abstractmethod
    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, rank: int) -> None:
        """Write this rank's part of the model (and, when sharded, optimizer) state into ``directory``."""

    @abstractmethod
    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, map_location: torch.device | str
    ) -> None:
        """Load what :meth:`save` wrote (on any world size) into ``model`` (and ``optimizer``)."""

    @abstractmethod
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The full weights on rank 0, keys without wrapper prefixes."""

    @abstractmethod
    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The optimizer's state for ``train_state.pt``; None when :meth:`save` keeps it itself."""

    @classmethod
    @abstractmethod
    def read_weights(cls, directory: Path, map_location: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """A checkpoint's weights as one plain state_dict, read without a process group."""

    def check_resumable(self, directory: Path) -> None:
        """Refuse a checkpoint whose layout this strategy cannot load."""
        saved = saved_by(directory)
        if saved is not None and saved.layout != self.layout:
            raise RuntimeError(
                f"{directory.name} was saved with scaling.strategy={saved.name}; "
                f"resume it with {saved.name}, not {self.name}"
            )


class DDPStrategy(Strategy):
    """Every rank holds the whole model; DistributedDataParallel all-reduces gradients; rank 0 saves."""

    name = "ddp"
    sharded = False
    equal_eval_batches = False
    layout = MODEL

    def prepare(self, model: nn.Module, cfg: JobConfig | Any, device: torch.device) -> nn.Module:
        """Exactly ``ray.train.torch.prepare_model(model, parallel_strategy="ddp")``, without Ray."""
        if device.type == "cuda":
            torch.cuda.set_device(device)
        model = model.to(device)
        if world_size() > 1:
            on_gpu = {"device_ids": [device], "output_device": device} if device.type == "cuda" else {}
            model = DistributedDataParallel(model, **on_gpu)
        return model

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, rank: int) -> None:
        if rank == 0:
            atomic_torch_save(self.model_state_dict(model), directory / MODEL)

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, map_location: torch.device | str
    ) -> None:
        unwrap(model).load_state_dict(self.read_weights(directory, map_location))  # optimizer: train_state.pt

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return unwrap(model).state_dict()

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        return optimizer.state_dict()

    @classmethod
    def read_weights(cls, directory: Path, map_location: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        return torch.load(Path(directory) / MODEL, map_location=map_location, weights_only=True)


class FSDPStrategy(Strategy):
    """FSDP2: parameters, gradients and optimizer state sharded over ranks; every rank saves its shards."""

    name = "fsdp"
    sharded = True
    equal_eval_batches = True  # every forward all-gathers: a rank with one batch fewer would hang the others
    layout = DCP_DIR

    def prepare(self, model: nn.Module, cfg: JobConfig | Any, device: torch.device) -> nn.Module:
        from elastic_train.train.fsdp import shard_model

        return shard_model(model, cfg, device)

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, rank: int) -> None:
        from elastic_train.train.fsdp import save_sharded

        save_sharded(model, optimizer, directory / DCP_DIR)  # collective: returns once every rank's part is written

    def load(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, map_location: torch.device | str
    ) -> None:
        from elastic_train.train.fsdp import load_sharded

        load_sharded(model, optimizer, directory / DCP_DIR)  # collective; reshards to the current world size

    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        from elastic_train.train.fsdp import full_model_state

        return full_model_state(model)  # collective: {} except on rank 0

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        return None  # in dcp/

    @classmethod
    def read_weights(cls, directory: Path, map_location: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        from elastic_train.train.fsdp import load_full_model_state

        return load_full_model_state(Path(directory) / DCP_DIR)


STRATEGIES: dict[str, type[Strategy]] = {"ddp": DDPStrategy, "fsdp": FSDPStrategy}


def make_strategy(name: str) -> Strategy:
    """The strategy for ``scaling.strategy``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown scaling.strategy {name!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]()


def saved_by(directory: str | Path) -> type[Strategy] | None:
    """The strategy whose layout a checkpoint folder has (the first that matches); None when none does."""
    d = Path(directory)
    return next((cls for cls in STRATEGIES.values() if (d / cls.layout).exists()), None)
