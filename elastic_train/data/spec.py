"""What every data source hands the engine: a DataSpec, train/val splits and a DataBundle. Torch only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about the data."""

    kind: Literal["classification", "language_model"]
    input_shape: tuple[int, ...]  # per sample, e.g. (64,), (1, 8, 8) or (seq_len,)
    num_classes: int  # classes, or the vocabulary size for language models
    tokens_per_sample: int = 1  # seq_len for language models (per-token metrics, throughput)


def eval_batch_size(spec: DataSpec, micro_batch_size: int = 0) -> int:
    """Validation batches: big for classification, small for language models (their logits are T x V)."""
    return max(micro_batch_size, 256 if spec.kind == "classification" else 8)


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


@dataclass
class StreamSplit:
    """A split read as a stream (``data.name=ray`` with ``data.ray_mode=stream``): no rows in memory, only what a
    worker needs to read its share (``source``, opaque here: :class:`elastic_train.data.ray_source.StreamSource`),
    the row count found by the driver's counting pass, and a few inputs for a model signature."""

    source: Any
    num_rows: int
    example: np.ndarray
    part: str = "train"  # "train" | "val"

    def __len__(self) -> int:
        return self.num_rows


Split = TensorSet | Dataset | StreamSplit
Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class SourceInfo:
    """Where a data set came from: what the tracker records as the run's dataset input (MLflow's Datasets panel).

    Every source fills one (built-in, in-memory, token shards, Ray Data); nothing here may hold a credential.
    """

    name: str  # e.g. "digits", "tokens", "ray:parquet"
    uri: str  # a path, s3://bucket/prefix, "sklearn:load_digits", "generated:synthetic_tokens"
    digest: str  # short content hash (or of the index / file listing for large sources)
    schema: dict[str, str] = field(default_factory=dict)  # column or field -> type, e.g. {"x": "float32[64]"}
    num_rows: int | None = None  # samples (or windows / documents), when known
    profile: dict[str, Any] = field(default_factory=dict)  # e.g. {"train_tokens": ..., "val_tokens": ...}


@dataclass
class DataBundle:
    train: Split
    val: Split
    spec: DataSpec
    info: dict[str, Any] = field(default_factory=dict)
    source: SourceInfo | None = None  # None: the engine derives one from the bundle (see issue 12)


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded (train, val) split of ``range(n)``; the validation side holds at least one sample."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, int(round(n * val_fraction)))
    return perm[n_val:], perm[:n_val]


def source_of(bundle: DataBundle, name: str) -> SourceInfo:
    """The bundle's own SourceInfo, else one derived from it: its ``info["source"]``, the shapes and dtypes of an
    in-memory set, and a content digest of its tensors (of the sizes only for a map-style set)."""
    if bundle.source is not None:
        return bundle.source
    import hashlib

    h = hashlib.sha256(name.encode())
    schema: dict[str, str] = {}
    for split in (bundle.train, bundle.val):
        if isinstance(split, TensorSet):
            for col, t in (("x", split.x), ("y", split.y)):
                h.update(t.detach().cpu().contiguous().numpy().tobytes())
                schema[col] = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape[1:])}"
        h.update(str(len(split)).encode())
    uri = str(bundle.info.get("source") or bundle.info.get("path") or name)
    return SourceInfo(name=name, uri=uri, digest=h.hexdigest()[:16], schema=schema,
                      num_rows=len(bundle.train) + len(bundle.val),
                      profile={"train_samples": len(bundle.train), "val_samples": len(bundle.val)})


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
    if isinstance(bundle.train, StreamSplit):
        return bundle.train.example[:n]
    return np.stack([np.asarray(bundle.train[i][0]) for i in range(min(n, len(bundle.train)))])
