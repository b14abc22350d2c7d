"""FSDP (``scaling.strategy=fsdp``): sharding a model with FSDP2 and checkpointing it with DCP.

:func:`shard_model` applies ``fully_shard`` to each of the model's ``shard_units()`` (a gpt's blocks) and then
to the root, on a 1-D device mesh over all workers: parameters, gradients and optimizer state are split
across ranks and gathered block by block. With ``train.precision=bf16`` (or fp16) the policy computes in that
dtype and reduce-scatters gradients in fp32; the sharded parameters and optimizer state stay fp32.

Sharded checkpoints are ``torch.distributed.checkpoint`` folders: every rank writes the chunks it owns
(``__<rank>_<n>.distcp``), rank 0 the ``.metadata`` index. The index records every tensor's global shape and
each chunk's offsets, so a load on any world size reads exactly the pieces its new shards cover: a run saved on
2 workers resumes on 1 or 4. Keys are canonical parameter names (no wrapper prefixes: units compile in place), the
same names ``model.pt`` of a DDP run uses.

Only torch here: no Ray, no MLflow, and nothing from the rest of the package (the FSDP strategy in
strategy.py calls these, and names the checkpoint's ``dcp/`` folder).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # public since torch 2.6 (pyproject's floor)

if TYPE_CHECKING:
    from elastic_train.config import JobConfig

_COMPUTE_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """Compute in bf16/fp16 with fp32 gradient reduction; fp32 = no casts at all."""
    dtype = _COMPUTE_DTYPE.get(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard_model(model: nn.Module, cfg: JobConfig | Any, device: torch.device) -> nn.Module:
    """FSDP2 over every worker of the default process group; returns ``model`` (sharded in place).

    With ``train.compile``, a model with units is compiled unit by unit instead of whole (torchtitan's
    order): FSDP's all-gather/reduce-scatter hooks then run eagerly around each compiled block. A model
    without units keeps the worker's whole-model compile.
    """
    if device.type == "cuda":  # FSDP2 allocates its shards and buffers on the current device
        torch.cuda.set_device(device)
    model.to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = mixed_precision(cfg.train.precision)
    units = model.shard_units() if hasattr(model, "shard_units") else []
    if units and (cfg.train.compile or getattr(model, "_compiled_call_impl", None) is not None):
        model._compiled_call_impl = None  # undo the worker's whole-model compile; compile each unit instead
        units = [_compile_in_place(model, unit) for unit in units]
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    # The root holds the embeddings and the head; it is gathered again right away for backward, so keep it.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=not units)
    return model


def _compile_in_place(root: nn.Module, unit: nn.Module) -> nn.Module:
    """Compile ``unit`` in place (``nn.Module.compile``: the module stays in the tree, its state_dict names
    unchanged, no ``torch.compile`` wrapper to see through). ``root``: the model it must belong to."""
    if not any(child is unit for child in root.modules()):
        raise ValueError("shard_units() returned a module that is not part of the model")
    unit.compile()
    return unit


# ------------------------------------------------------------------------------------- checkpoints


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Every rank writes its shards of the model and optimizer state into ``directory`` (collective)."""
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(directory))


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, directory: str | Path) -> None:
    """Load model and optimizer state into the current shards, whatever world size saved them (collective)."""
    msd, osd = get_state_dict(model, optimizer)  # initialises the optimizer state to be overwritten
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model state_dict on rank 0 (CPU), ``{}`` on other ranks. Collective: every rank calls it.

    Keys come in the module's own order (as in a DDP run's ``model.pt``), compiled units included.
    """
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    order = list(model.state_dict())
    return {k: full[k] for k in order if k in full}


def load_full_model_state(directory: str | Path) -> dict[str, torch.Tensor]:
    """The model weights of a DCP folder (a checkpoint's ``dcp/``) as one plain state_dict, read without a
    process group."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = Path(directory)
    meta = dcp.FileSystemReader(str(path)).read_metadata()
    weights = {
        key.removeprefix("model."): torch.empty(m.size, dtype=m.properties.dtype)
        for key, m in meta.state_dict_metadata.items()
        if key.startswith("model.") and isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "no process group: assuming a single process" is the intent here
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": weights}, checkpoint_id=str(path), no_dist=True)
    return weights
