"""Datasets and the data order.

Built-in datasets (``digits``, ``synthetic``) are in-memory tensors served by batched tensor indexing: one
``x[idx]`` gather per micro-batch, no per-sample collation. Map-style datasets (a user's ``module:function``
returning ``torch.utils.data.Dataset`` objects) go through a DataLoader with worker processes and pinned
memory, driven by the same index schedule.

The data order is a pure function of ``(seed, epoch)`` (DESIGN invariant 3): each epoch is a seeded
permutation of the training set cut into global batches of G samples (the ragged tail is dropped so every
optimizer step sees exactly G); global step ``s`` consumes global batch ``s`` and worker ``r`` takes its
:class:`~elastic_train.batching.BatchPlan` slice. Resuming at ``(epoch, step)`` on any world size therefore
neither repeats nor skips a sample.
"""

from __future__ import annotations

import importlib
import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from elastic_train.batching import BatchPlan
from elastic_train.errors import ConfigError

if TYPE_CHECKING:  # pydantic-free at run time: bench/gpu.py imports this on a torch-only machine
    from elastic_train.config import JobConfig


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about the data."""

    kind: Literal["classification", "language_model"]
    input_shape: tuple[int, ...]  # per sample, e.g. (64,), (1, 8, 8) or (seq_len,)
    num_classes: int  # classes, or the vocabulary size for language models
    tokens_per_sample: int = 1  # seq_len for language models (per-token metrics, throughput)


@dataclass
class TensorSet:
    """An in-memory dataset: row i of ``x`` and ``y`` is sample i."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.x)

    def to(self, device: torch.device | str, pin: bool = False) -> TensorSet:
        if pin:
            return TensorSet(self.x.pin_memory(), self.y.pin_memory())
        return TensorSet(self.x.to(device), self.y.to(device))

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + self.y.nbytes


Split = TensorSet | Dataset


@dataclass
class DataBundle:
    train: Split
    val: Split
    spec: DataSpec
    info: dict[str, Any] = field(default_factory=dict)


# -------------------------------------------------------------------------------------------- builders


def _split(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(n * val_fraction)))
    return perm[n_val:], perm[:n_val]


def build_digits(job: JobConfig) -> DataBundle:
    """scikit-learn's bundled 8x8 digits (1797 images, no download), scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    cfg, seed = job.data, job.seed
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    y = torch.tensor(d.target, dtype=torch.long)
    tr, va = _split(len(x), cfg.val_fraction, seed)
    spec = DataSpec("classification", (1, 8, 8), 10)
    return DataBundle(TensorSet(x[tr], y[tr]), TensorSet(x[va], y[va]), spec, {"source": "sklearn.load_digits"})


def build_synthetic(job: JobConfig) -> DataBundle:
    """Seeded, learnable classification: labels from a random two-layer teacher network."""
    cfg, seed = job.data, job.seed
    g = torch.Generator().manual_seed(10_007 + seed)
    n, f, c = cfg.num_samples, cfg.num_features, cfg.num_classes
    x = torch.randn(n, f, generator=g)
    w1 = torch.randn(f, 2 * f, generator=g) / f**0.5
    w2 = torch.randn(2 * f, c, generator=g) / (2 * f) ** 0.5
    y = torch.argmax(torch.tanh(x @ w1) @ w2, dim=1)
    tr, va = _split(n, cfg.val_fraction, seed)
    spec = DataSpec("classification", (f,), c)
    return DataBundle(TensorSet(x[tr], y[tr]), TensorSet(x[va], y[va]), spec, {"source": "synthetic teacher"})


def _language_model_data(name: str) -> Callable[[JobConfig], DataBundle]:
    def build(job: JobConfig) -> DataBundle:
        from elastic_train import text  # token datasets live in their own module; imported on use

        return getattr(text, f"build_{name}")(job)

    return build


# A builder gets the whole JobConfig: token datasets need model.seq_len, for one.
BUILTIN: dict[str, Callable[[JobConfig], DataBundle]] = {
    "digits": build_digits,
    "synthetic": build_synthetic,
    "synthetic_tokens": _language_model_data("synthetic_tokens"),
    "text": _language_model_data("text"),
}


def resolve_import(path: str, field_name: str) -> Callable[..., Any]:
    """``'package.module:function'`` -> the function; a ConfigError naming ``field_name`` otherwise."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(field_name, path, "unknown name; use a built-in or 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's path being wrong
        raise ConfigError(field_name, path, f"cannot import {module_name!r} ({type(e).__name__}: {e})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(field_name, path, f"{module_name!r} has no callable {attr!r}")
    return fn


def build_data(cfg: JobConfig) -> DataBundle:
    """Build the configured dataset (on the driver to validate it, then on every worker)."""
    name = cfg.data.name
    if name in BUILTIN:
        bundle = BUILTIN[name](cfg)
    elif ":" in name:
        bundle = _user_data(resolve_import(name, "data.name"), cfg)
    else:
        known = ", ".join(sorted(BUILTIN))
        raise ConfigError("data.name", name, f"unknown dataset; built-ins: {known}, or 'package.module:function'")
    n_train = len(bundle.train)
    if cfg.train.global_batch_size > n_train:
        raise ConfigError(
            "train.global_batch_size",
            cfg.train.global_batch_size,
            f"larger than the training set ({n_train} samples of data.name={name!r})",
        )
    if len(bundle.val) == 0:
        raise ConfigError("data.val_fraction", cfg.data.val_fraction, "leaves an empty validation set")
    return bundle


def _user_data(fn: Callable[..., Any], cfg: JobConfig) -> DataBundle:
    """A user function returns a DataBundle, or ``(train, val)`` Datasets, or ``((x, y), (x, y))`` tensors."""
    try:
        out = fn(**cfg.data.options)
    except Exception as e:  # noqa: BLE001
        raise ConfigError("data.name", cfg.data.name, f"raised {type(e).__name__}: {e}") from None
    if isinstance(out, DataBundle):
        return out
    if isinstance(out, tuple | list) and len(out) == 2:
        train, val = (_as_split(s) for s in out)
        if train is not None and val is not None and len(train) > 0:
            return DataBundle(train, val, _infer_spec(train), {"source": cfg.data.name})
    raise ConfigError(
        "data.name", cfg.data.name, "must return a DataBundle, (train, val) Datasets or ((x, y), (x, y)) tensors"
    )


def _as_split(obj: Any) -> Split | None:
    if isinstance(obj, TensorSet | Dataset):
        return obj
    if isinstance(obj, tuple | list) and len(obj) == 2 and all(isinstance(t, torch.Tensor) for t in obj):
        return TensorSet(obj[0], obj[1])
    return None


def _infer_spec(train: Split) -> DataSpec:
    x, y = (train.x[0], train.y) if isinstance(train, TensorSet) else train[0]
    if isinstance(train, TensorSet):
        num_classes = int(y.max()) + 1
    else:
        num_classes = int(max(int(train[i][1]) for i in range(min(len(train), 1000)))) + 1
    return DataSpec("classification", tuple(torch.as_tensor(x).shape), max(num_classes, 2))


# -------------------------------------------------------------------------------------------- data order


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The order of the training set in ``epoch``: a pure function of (seed, epoch)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch + 1))


def steps_per_epoch(n_train: int, global_batch_size: int) -> int:
    """Optimizer steps per epoch; the ragged tail (< G samples) is dropped so every step sees exactly G."""
    return n_train // global_batch_size


class ElasticSampler:
    """The micro-batch index lists one worker consumes, for any (epoch, start step, world size)."""

    def __init__(self, n_train: int, plan: BatchPlan, rank: int, seed: int):
        self.n, self.plan, self.rank, self.seed = n_train, plan, rank, seed
        self.steps = steps_per_epoch(n_train, plan.global_batch_size)
        self._slices = plan.micro_slices(rank)

    def global_batch(self, epoch: int, step: int) -> torch.Tensor:
        g = self.plan.global_batch_size
        return epoch_permutation(self.seed, epoch, self.n)[step * g : (step + 1) * g]

    def steps_from(self, epoch: int, start_step: int) -> Iterator[tuple[int, list[torch.Tensor]]]:
        """Yield ``(step, [micro-batch indices])`` for this worker from ``start_step`` to the epoch end."""
        perm = epoch_permutation(self.seed, epoch, self.n)
        g = self.plan.global_batch_size
        for step in range(start_step, self.steps):
            batch = perm[step * g : (step + 1) * g]
            yield step, [batch[a:b] for a, b in self._slices]


class _MicroBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Feeds a DataLoader the micro-batch index lists of one worker, in order."""

    def __init__(self, sampler: ElasticSampler, epoch: int, start_step: int):
        self.sampler, self.epoch, self.start_step = sampler, epoch, start_step

    def __iter__(self) -> Iterator[list[int]]:
        for _, micro in self.sampler.steps_from(self.epoch, self.start_step):
            for idx in micro:
                if len(idx):
                    yield idx.tolist()

    def __len__(self) -> int:
        nonempty = sum(1 for a, b in self.sampler._slices if b > a)
        return (self.sampler.steps - self.start_step) * nonempty


Batch = tuple[torch.Tensor, torch.Tensor]


class WorkerData:
    """Serves one worker's micro-batches, on its device, for each global step.

    In-memory sets live on the device when they fit comfortably (indexing is then a device gather), else in
    pinned host memory with non-blocking copies; the next step's batch is always prepared before the current
    one is returned, so host-to-device transfer overlaps compute.
    """

    DEVICE_RESIDENT_MAX_BYTES = 2 << 30

    def __init__(
        self,
        bundle: DataBundle,
        plan: BatchPlan,
        rank: int,
        seed: int,
        device: torch.device,
        loader_workers: int = 2,
        trace_path: str | None = None,
    ):
        self.bundle, self.plan, self.rank, self.device = bundle, plan, rank, device
        self.sampler = ElasticSampler(len(bundle.train), plan, rank, seed)
        self.loader_workers = loader_workers
        self.train = self._place(bundle.train)
        self._trace = open(f"{trace_path}.rank{rank}", "a") if trace_path else None  # noqa: SIM115

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps

    def _place(self, split: Split) -> Split:
        if not isinstance(split, TensorSet):
            return split
        if self.device.type == "cuda":
            if split.nbytes <= self.DEVICE_RESIDENT_MAX_BYTES:
                return split.to(self.device)
            return split.to("cpu", pin=True)
        return split

    def _to_device(self, x: torch.Tensor, y: torch.Tensor) -> Batch:
        if x.device == self.device:
            return x, y
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def epoch(self, epoch: int, start_step: int = 0) -> Iterator[tuple[int, list[Batch]]]:
        """Yield ``(step, micro-batches)`` from ``start_step``; batches are already on the device."""
        source = self._tensor_steps if isinstance(self.train, TensorSet) else self._loader_steps
        it = source(epoch, start_step)
        nxt = next(it, None)
        while nxt is not None:
            cur, nxt = nxt, next(it, None)  # prefetch: the next gather/copy is issued before we yield
            yield cur

    def _tensor_steps(self, epoch: int, start_step: int) -> Iterator[tuple[int, list[Batch]]]:
        data = self.train
        assert isinstance(data, TensorSet)
        for step, micro in self.sampler.steps_from(epoch, start_step):
            self._record(epoch, step, micro)
            batches = []
            for idx in micro:
                if len(idx):
                    if idx.device != data.x.device:  # device-resident set: pinned, so the copy is truly async
                        idx = idx.pin_memory().to(data.x.device, non_blocking=True)
                    x, y = data.x[idx], data.y[idx]
                    if self.device.type == "cuda" and x.device.type == "cpu":
                        x, y = x.pin_memory(), y.pin_memory()  # a gather from pinned memory is pageable
                    batches.append(self._to_device(x, y))
            yield step, batches

    def _loader_steps(self, epoch: int, start_step: int) -> Iterator[tuple[int, list[Batch]]]:
        loader = DataLoader(
            self.train,
            batch_sampler=_MicroBatchSampler(self.sampler, epoch, start_step),
            num_workers=self.loader_workers,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if self.loader_workers else None,
        )
        batches_iter = iter(loader)
        for step, micro in self.sampler.steps_from(epoch, start_step):
            self._record(epoch, step, micro)
            batches = []
            for idx in micro:
                if len(idx):
                    x, y = next(batches_iter)
                    batches.append(self._to_device(x, y))
            yield step, batches

    def val_batches(self, batch_size: int, equal_counts: bool = False) -> Iterator[Batch]:
        """This worker's contiguous shard of the validation set (shards cover it exactly once).

        ``equal_counts`` (FSDP, whose every forward is a collective): every rank yields the same number of
        batches, its shard cut into that many near-equal parts (empty only if the shard is that small).
        """
        val, n = self.bundle.val, len(self.bundle.val)
        w = self.plan.world_size
        start, end = self.rank * n // w, (self.rank + 1) * n // w
        if equal_counts:
            k = max(1, math.ceil(math.ceil(n / w) / batch_size))
            bounds = [(start + i * (end - start) // k, start + (i + 1) * (end - start) // k) for i in range(k)]
        else:
            bounds = [(a, min(a + batch_size, end)) for a in range(start, end, batch_size)]
        for a, b in bounds:
            if isinstance(val, TensorSet):
                yield self._to_device(val.x[a:b], val.y[a:b])
            else:
                xs, ys = zip(*(val[i] for i in range(a, b) or [0]), strict=True)  # [0]: shape of an empty part
                x, y = torch.stack([torch.as_tensor(t) for t in xs]), torch.as_tensor(ys)
                yield self._to_device(x[: b - a], y[: b - a])

    def _record(self, epoch: int, step: int, micro: Sequence[torch.Tensor]) -> None:
        if self._trace is None:
            return
        ids = torch.cat(list(micro)).tolist() if micro else []
        self._trace.write(
            json.dumps({"epoch": epoch, "step": step, "rank": self.rank, "world_size": self.plan.world_size,
                        "t": time.time(), "ids": ids})
            + "\n"
        )
        self._trace.flush()

    def close(self) -> None:
        if self._trace is not None:
            self._trace.close()


def describe(bundle: DataBundle) -> dict[str, Any]:
    return {
        "train_samples": len(bundle.train),
        "val_samples": len(bundle.val),
        "kind": bundle.spec.kind,
        "input_shape": list(bundle.spec.input_shape),
        "num_classes": bundle.spec.num_classes,
        **bundle.info,
    }


def as_numpy_example(bundle: DataBundle, n: int = 2) -> np.ndarray:
    """A few training inputs, for an MLflow model signature and input example."""
    if isinstance(bundle.train, TensorSet):
        return bundle.train.x[:n].cpu().numpy()
    return np.stack([np.asarray(bundle.train[i][0]) for i in range(min(n, len(bundle.train)))])
