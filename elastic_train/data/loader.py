"""WorkerData: one worker's micro-batches on its device, for each global step.

In-memory sets are served by batched tensor indexing (one ``x[idx]`` gather per micro-batch, no per-sample
collation); map-style datasets (a user's torch ``Dataset``) go through a DataLoader with worker processes and
pinned memory, driven by the same index schedule (:mod:`elastic_train.data.sampler`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader

from elastic_train.data.batching import BatchPlan
from elastic_train.data.sampler import ElasticSampler, _MicroBatchSampler
from elastic_train.data.spec import Batch, DataBundle, Split, StreamSplit, TensorSet
from elastic_train.data.trace import Trace


@runtime_checkable
class StepSource(Protocol):
    """What the training session asks of a worker's data, whatever the source: :class:`WorkerData` (in-memory
    sets, token shards, map-style datasets) or :class:`~elastic_train.data.stream.StreamData` (Ray Data
    streamed through the worker)."""

    trace: Trace  # the exactly-once trace of the samples each step took (data.trace_path)

    @property
    def steps_per_epoch(self) -> int: ...

    def epoch(self, epoch: int, start_step: int = 0, then: int | None = None) -> Iterator[tuple[int, list[Batch]]]:
        """``(step, micro-batches on the device)`` from ``start_step``; ``then``: the epoch asked for next."""
        ...

    def val_batches(self, batch_size: int, equal_counts: bool = False) -> Iterator[Batch]: ...

    def position(self, epoch: int, step_in_epoch: int) -> dict[str, Any] | None:
        """What a checkpoint must carry beyond (epoch, step) to resume mid-epoch (None: nothing)."""
        ...

    def restore(self, position: dict[str, Any] | None) -> None: ...

    def mark(self, event: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def worker_data(bundle: DataBundle, plan: BatchPlan, rank: int, seed: int, device: torch.device,
                loader_workers: int = 2, trace_path: str | None = None) -> StepSource:
    """The worker's data: :class:`WorkerData`, or :class:`~elastic_train.data.stream.StreamData` for a streamed
    bundle (whose ``position`` / ``restore`` carry the ids consumed mid-epoch)."""
    if isinstance(bundle.train, StreamSplit):
        from elastic_train.data.stream import StreamData

        return StreamData(bundle, plan, rank, seed, device, trace_path)
    return WorkerData(bundle, plan, rank, seed, device, loader_workers, trace_path)


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
        self.trace = Trace(trace_path, rank, plan.world_size)

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

    def epoch(self, epoch: int, start_step: int = 0, then: int | None = None) -> Iterator[tuple[int, list[Batch]]]:
        """Yield ``(step, micro-batches)`` from ``start_step``; batches are already on the device. (``then``, the
        epoch asked for next, matters to streamed sources only: StreamData starts it early.)"""
        fetch = self._fetcher(epoch, start_step)
        steps = ((step, [self._to_device(*fetch(idx)) for idx in micro if len(idx)])
                 for step, micro in self._recorded(epoch, start_step))
        nxt = next(steps, None)
        while nxt is not None:
            cur, nxt = nxt, next(steps, None)  # prefetch: the next gather/copy is issued before we yield
            yield cur

    def _recorded(self, epoch: int, start_step: int) -> Iterator[tuple[int, list[torch.Tensor]]]:
        """The sampler's ``(step, micro-batch indices)``, each step traced as it is taken."""
        for step, micro in self.sampler.steps_from(epoch, start_step):
            self._record(epoch, step, micro)
            yield step, micro

    def _fetcher(self, epoch: int, start_step: int) -> Callable[[torch.Tensor], Batch]:
        """How one micro-batch's sample indices become ``(x, y)`` on the host (or already on the device), by kind
        of source: an in-memory set (one indexed gather), memory-mapped windows with ``gather(idx)`` (token
        shards: only this worker's samples are read), or a map-style dataset behind a DataLoader driven by the
        same index schedule. On a GPU, host tensors are pinned so that the copy is truly asynchronous."""
        data, pin = self.train, self.device.type == "cuda"
        if isinstance(data, TensorSet):
            def fetch(idx: torch.Tensor) -> Batch:
                if idx.device != data.x.device:  # device-resident set: pinned, so the copy is truly async
                    idx = idx.pin_memory().to(data.x.device, non_blocking=True)
                x, y = data.x[idx], data.y[idx]
                if pin and x.device.type == "cpu":
                    x, y = x.pin_memory(), y.pin_memory()  # a gather from pinned memory is pageable
                return x, y
            return fetch
        if hasattr(data, "gather"):
            def fetch(idx: torch.Tensor) -> Batch:
                x, y = data.gather(idx)
                return (x.pin_memory(), y.pin_memory()) if pin else (x, y)
            return fetch
        loader = DataLoader(
            data,
            batch_sampler=_MicroBatchSampler(self.sampler, epoch, start_step),
            num_workers=self.loader_workers,
            pin_memory=pin,
            prefetch_factor=4 if self.loader_workers else None,
        )
        batches = iter(loader)
        return lambda idx: next(batches)

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
            elif hasattr(val, "gather"):
                yield self._to_device(*val.gather(torch.arange(a, b)))
            else:
                xs, ys = zip(*(val[i] for i in range(a, b) or [0]), strict=True)  # [0]: shape of an empty part
                x, y = torch.stack([torch.as_tensor(t) for t in xs]), torch.as_tensor(ys)
                yield self._to_device(x[: b - a], y[: b - a])

    def _record(self, epoch: int, step: int, micro: Sequence[torch.Tensor]) -> None:
        if self.trace.enabled:
            self.trace.step(epoch, step, torch.cat(list(micro)).tolist() if micro else [])

    def mark(self, event: dict[str, Any]) -> None:
        """A non-step line in the trace (e.g. where a PBT clone took over its donor's position)."""
        self.trace.mark(event)

    def position(self, epoch: int, step_in_epoch: int) -> dict[str, Any] | None:
        """Nothing beyond (epoch, step): the order is a pure function of (seed, epoch)."""
        return None

    def restore(self, position: dict[str, Any] | None) -> None:
        pass

    def close(self) -> None:
        self.trace.close()
