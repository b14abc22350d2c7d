"""TrainState: everything a bit-exact resume needs, saved and loaded through ``state_dict()``.

A checkpoint is a directory with fixed file names::

    model.pt            DDP: the unwrapped model's state_dict (rank 0)
    dcp/                FSDP: model and optimizer shards, torch.distributed.checkpoint (every rank)
    train_state.pt      optimizer, LR schedule, grad scaler, progress, counters (rank 0; FSDP: no optimizer)
    rng/rank_<r>.pt     Python, NumPy and torch CPU/CUDA RNG states of worker r (every rank)
    meta.json           progress, metrics, world size, the resolved config; written last (rank 0)

The strategy (strategy.py) writes and reads the first two; this module the rest, without asking which
strategy it holds. Every file is written to a temporary name and renamed into place, and ``meta.json`` goes
last: a directory without it is incomplete and is refused on load, so a crash during a save never yields a
half checkpoint. The upload to run storage (:func:`upload_checkpoint`) keeps that order on object stores, where
there is no rename. No Ray and no MLflow here.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs
import torch
from torch import nn

from elastic_train.compat import features
from elastic_train.compat.torch import set_last_lr
from elastic_train.files import write_text_atomically
from elastic_train.train.loop import Precision
from elastic_train.train.strategy import DDPStrategy, Strategy, atomic_torch_save, saved_by

FORMAT_VERSION = 1
META = "meta.json"
TRAIN_STATE = "train_state.pt"


@dataclass
class Progress:
    """Where training stands. ``step_in_epoch`` is the next global batch to consume in ``epoch``."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    samples_seen: int = 0

    def advance(self, samples: int, steps_per_epoch: int) -> None:
        self.global_step += 1
        self.samples_seen += samples
        self.step_in_epoch += 1
        if self.step_in_epoch >= steps_per_epoch:
            self.epoch += 1
            self.step_in_epoch = 0

    def epoch_label(self) -> int:
        """1-based epoch in progress (the one just finished at an epoch boundary)."""
        return self.epoch if self.step_in_epoch == 0 else self.epoch + 1


@dataclass
class Goodput:
    """Where the run's wall time went, cumulative over restarts and job resumes (seconds / steps)."""

    productive_s: float = 0.0  # inside training steps (forward, backward, optimizer, data wait)
    checkpoint_s: float = 0.0  # training blocked on checkpoint save + report
    restart_lost_s: float = 0.0  # from the last sign of life before a failure to the first step after
    recomputed_steps: int = 0  # steps done after the restored checkpoint and lost in a failure
    restarts: int = 0
    startup_s: float = 0.0  # each driver: its launch to its first training loop's start
    eval_s: float = 0.0  # training blocked on validation at checkpoints
    checkpoints: int = 0  # checkpoints taken (their blocking cost: checkpoint_s + eval_s): train/interval.py
    auto_every_steps: int = 0  # checkpoint.every_steps=auto: the interval in force (0: none chosen yet)
    interval_changes: int = 0  # how often auto changed it
    # Durability (train/uploads.py, rank 0's part): a checkpoint's hand-off to the moment it is on storage, summed
    # over the uploads measured; and, at its worst, how far training ran ahead of its newest durable checkpoint
    upload_s: float = 0.0
    uploads: int = 0
    behind_max_steps: int = 0
    behind_max_s: float = 0.0

    def summary(self) -> dict[str, float]:
        out = asdict(self)
        accounted = self.productive_s + self.checkpoint_s + self.eval_s + self.restart_lost_s + self.startup_s
        out["goodput_ratio"] = self.productive_s / accounted if accounted > 0 else 0.0
        return out


RECENT_METRICS = 256  # step-metric records a checkpoint carries (RunRecord.recent_metrics)


@dataclass
class RunRecord:
    """Run identity and history carried inside every checkpoint."""

    run_name: str = ""
    mlflow_run_id: str | None = None
    world_sizes: list[int] = field(default_factory=list)
    goodput: Goodput = field(default_factory=Goodput)
    best_score: float | None = None
    # The hyperparameter schedule the weights were trained with, one entry per stretch: from which global step,
    # which learning rate and global batch, trained by which run (a PBT clone starts from its donor's schedule).
    schedule: list[dict[str, Any]] = field(default_factory=list)
    # The last step metrics logged (``[step, {name: value}]``, at most RECENT_METRICS): a restart logs them again,
    # unless the tracking store holds them, so a sender lost with its host (or refused: train/fence.py) loses none.
    recent_metrics: list[list[Any]] = field(default_factory=list)


def schedule_entry(step: int, lr: float, global_batch_size: int, run_name: str, **extra: Any) -> dict[str, Any]:
    """One stretch of a run's hyperparameter schedule (:attr:`RunRecord.schedule`)."""
    return {"step": step, "lr": lr, "global_batch_size": global_batch_size, "run_name": run_name, **extra}


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        # this worker's device only: get_rng_state_all() would create a context on every GPU the process sees
        # (Ray Train shows each worker all of its node's training GPUs) and could not be restored where fewer
        # are visible
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, list | tuple):  # written before: every visible device's; this worker's is its own
            cuda = cuda[min(torch.cuda.current_device(), len(cuda) - 1)]
        torch.cuda.set_rng_state(cuda.cpu(), torch.cuda.current_device())


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class IncompleteCheckpoint(RuntimeError):
    pass


class TrainState:
    """Model, optimizer, schedule, scaler, RNG, progress and run record, saved and restored together.

    ``strategy`` (DDP when not given) writes and reads the model's files, and the optimizer's when it shards it.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        precision: Precision,
        strategy: Strategy | None = None,
        progress: Progress | None = None,
        record: RunRecord | None = None,
    ):
        self.model, self.optimizer, self.scheduler, self.precision = model, optimizer, scheduler, precision
        self.strategy = strategy or DDPStrategy()
        self.progress = progress or Progress()
        self.record = record or RunRecord()
        # Global (all-worker) sums [loss, correct, samples] of the epoch in progress and of the last one
        # completed: the final train_loss is the same whether or not the run was interrupted.
        self.epoch_sums = [0.0, 0.0, 0.0]
        self.last_epoch_sums: list[float] | None = None
        # A streamed source's place in the epoch beyond (epoch, step): the sample ids already consumed
        # (elastic_train.data.stream); None for sources whose order is a pure function of (seed, epoch).
        self.data_position: dict[str, Any] | None = None

    def record_epoch(self, totals: dict[str, float]) -> None:
        """Add a reduced window; at an epoch boundary the epoch's sums become the last completed."""
        for i, key in enumerate(("loss_sum", "correct", "samples")):
            self.epoch_sums[i] += totals[key]
        if self.progress.step_in_epoch == 0:
            self.last_epoch_sums, self.epoch_sums = self.epoch_sums, [0.0, 0.0, 0.0]

    def epoch_metrics(self, tokens_per_sample: int = 1) -> dict[str, float]:
        """train_loss / train_accuracy of the last completed epoch (or the current one, mid-epoch)."""
        sums = self.last_epoch_sums if self.progress.step_in_epoch == 0 and self.last_epoch_sums else self.epoch_sums
        n = max(sums[2], 1.0)
        return {"train_loss": sums[0] / n, "train_accuracy": sums[1] / (n * tokens_per_sample)}

    # ------------------------------------------------------------------------------ state_dict
    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights; for a sharded model a collective that every rank calls ({} except on rank 0)."""
        return self.strategy.model_state_dict(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Everything but the model weights and RNG (those have files of their own)."""
        return {
            "format_version": FORMAT_VERSION,
            "optimizer": self.strategy.optimizer_state_dict(self.optimizer),  # None when sharded: in dcp/
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict() if self.precision.scaler else None,
            "progress": asdict(self.progress),
            "record": asdict(self.record),
            "epoch_sums": self.epoch_sums,
            "last_epoch_sums": self.last_epoch_sums,
            "data_position": self.data_position,
        }

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        if sd["optimizer"] is not None:
            self.optimizer.load_state_dict(sd["optimizer"])
        self.scheduler.load_state_dict(sd["scheduler"])
        if self.precision.scaler is not None and sd.get("scaler"):
            self.precision.scaler.load_state_dict(sd["scaler"])
        self.progress = Progress(**sd["progress"])
        self.epoch_sums = list(sd["epoch_sums"])
        self.last_epoch_sums = sd["last_epoch_sums"]
        self.data_position = sd.get("data_position")  # absent in checkpoints written before streaming
        rec = dict(sd["record"])
        rec["goodput"] = Goodput(**rec["goodput"])
        self.record = RunRecord(**rec)

    def adopt(self, lr: float, record: RunRecord, global_batch_size: int | None = None) -> dict[str, Any]:
        """Continue another run's restored state as the run ``record`` names, at learning rate ``lr``
        (population-based training): model, optimizer moments, schedule position, data position and RNG stay the
        donor's; the learning rate (the schedule's base) and the run's identity and accounting become this run's,
        and ``record``'s hyperparameter schedule is the donor's followed by this run's values from here on.
        Returns where it came from."""
        origin = {"run_name": self.record.run_name, "global_step": self.progress.global_step,
                  "epoch": self.progress.epoch, "step_in_epoch": self.progress.step_in_epoch}
        step = self.scheduler.last_epoch
        if global_batch_size is None:  # unchanged: the donor's
            global_batch_size = (self.record.schedule or [{}])[-1].get("global_batch_size")
        record.schedule = [*self.record.schedule, schedule_entry(
            self.progress.global_step, lr, global_batch_size, record.run_name, cloned_from=self.record.run_name)]
        self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]
        for group, factor in zip(self.optimizer.param_groups, self.scheduler.lr_lambdas, strict=True):
            group["initial_lr"] = lr
            group["lr"] = lr * factor(step)
        if features.enabled("pbt_last_lr"):  # else get_last_lr() says the donor's rate until the next step
            set_last_lr(self.scheduler, [g["lr"] for g in self.optimizer.param_groups])
        self.record = record
        return origin

    # ------------------------------------------------------------------------------ save / load
    def save(self, directory: str | Path, rank: int, meta: dict[str, Any]) -> None:
        """Write this rank's part of a checkpoint into ``directory`` (rank 0 writes meta.json last)."""
        d = Path(directory)
        (d / "rng").mkdir(parents=True, exist_ok=True)
        atomic_torch_save(rng_state(), d / "rng" / f"rank_{rank}.pt")
        self.strategy.save(self.model, self.optimizer, d, rank)  # sharded: a collective
        if rank != 0:
            return
        atomic_torch_save(self.state_dict(), d / TRAIN_STATE)
        full_meta = {
            "format_version": FORMAT_VERSION,
            "progress": asdict(self.progress),
            "run_name": self.record.run_name,
            "mlflow_run_id": self.record.mlflow_run_id,
            "world_sizes": self.record.world_sizes,
            "schedule": self.record.schedule,
            **meta,
        }
        write_text_atomically(d / META, json.dumps(full_meta, indent=2, default=str))

    def load(self, directory: str | Path, rank: int, map_location: torch.device | str = "cpu") -> bool:
        """Restore from ``directory``; returns whether this rank's RNG state was found (same world size)."""
        d = Path(directory)
        read_meta(d)  # refuses an incomplete checkpoint
        self.strategy.check_resumable(d)
        self.strategy.load(self.model, self.optimizer, d, map_location)  # sharded: a collective
        self.load_state_dict(torch.load(d / TRAIN_STATE, map_location=map_location, weights_only=False))
        rng_file = d / "rng" / f"rank_{rank}.pt"
        if rng_file.exists():
            set_rng_state(torch.load(rng_file, weights_only=False))
            return True
        return False


def upload_checkpoint(local_dir: str | Path, fs: pyarrow.fs.FileSystem, dest: str) -> None:
    """Copy one rank's checkpoint part from ``local_dir`` to ``dest`` on ``fs``, ``meta.json`` last: an upload
    cut short (a store that stays away past its retries) leaves a directory that every reader refuses as
    incomplete, never a meta.json beside missing weights. (pyarrow's ``copy_files`` of a directory writes its
    files in parallel, in no set order.)"""
    local, root = pyarrow.fs.LocalFileSystem(), Path(local_dir)
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: (p.name == META, str(p)))
    dest = dest.rstrip("/")
    for folder in sorted({f.parent.relative_to(root).as_posix() for f in files} | {"."}):
        fs.create_dir(dest if folder == "." else f"{dest}/{folder}", recursive=True)  # a local store needs them
    for f in files:
        pyarrow.fs.copy_files(str(f), f"{dest}/{f.relative_to(root).as_posix()}",
                              source_filesystem=local, destination_filesystem=fs)


def params_sha256(state_dict: dict[str, Any]) -> str:
    """sha256 over the state_dict's tensors' bytes in key order: a bitwise reproducibility fingerprint."""
    h = hashlib.sha256()
    for value in state_dict.values():
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous().reshape(-1)
            h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def read_meta(directory: str | Path) -> dict[str, Any]:
    """A checkpoint's meta.json; IncompleteCheckpoint when it is missing (the save never finished)."""
    path = Path(directory) / META
    if not path.is_file():
        raise IncompleteCheckpoint(f"{directory} has no {META}: the save did not complete")
    return json.loads(path.read_text())


def checkpoint_dir_name(progress: Progress) -> str:
    """Fixed, sortable names: every rank of a save writes into the same directory."""
    return f"checkpoint_{progress.global_step:09d}"


def load_model(directory: str | Path, map_location: str = "cpu") -> tuple[nn.Module, Any, dict[str, Any]]:
    """Rebuild the model a checkpoint holds: ``(model, JobConfig, meta)``; no data needed."""
    from elastic_train.config import JobConfig
    from elastic_train.data import DataSpec
    from elastic_train.models import build_model

    meta = read_meta(directory)
    cfg = JobConfig.model_validate(meta["config"])
    spec_d = dict(meta["data_spec"])
    spec_d["input_shape"] = tuple(spec_d["input_shape"])
    model = build_model(cfg, DataSpec(**spec_d))
    strategy = saved_by(directory)  # a sharded checkpoint's dcp/ folder is consolidated
    if strategy is None:
        raise IncompleteCheckpoint(f"{directory} holds no model weights")
    model.load_state_dict(strategy.read_weights(Path(directory), map_location))
    return model.eval(), cfg, meta
