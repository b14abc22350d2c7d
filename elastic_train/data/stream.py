"""Streaming a data set through an epoch, exactly once, across restarts and resizes (``data.ray_mode=stream``).

No Ray here (torch and NumPy only): the reading is done by a *source* (for ``data.name=ray`` the
:class:`~elastic_train.data.ray_source.StreamSource`, the only module in ``data/`` that imports Ray), which gives

* ``split(part, epoch, seed, world, exclude) -> list`` of ``world`` picklable iterators over the epoch's rows,
  without the ids in ``exclude`` (called on rank 0 only; the list is broadcast over torch.distributed), and
* ``batches(iterator, batch_size, seed) -> Iterator[(x, y, ids)]``: one rank's rows as tensors plus their ids.

:class:`StreamData` has :class:`~elastic_train.data.loader.WorkerData`'s interface (``steps_per_epoch``,
``epoch``, ``val_batches``, ``mark``, ``close``) plus ``position`` / ``restore``: the ids this epoch has
consumed, gathered from every rank at each checkpoint and kept in the TrainState (DESIGN invariant 4). On a
resume mid-epoch the source leaves them out; every epoch then consumes ``floor(N / G) * G`` distinct samples,
none twice, whatever the world size was before and after. The guarantee is exactly-once, not bitwise: which
rows land in which step depends on Ray Data's scheduling.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from elastic_train.data.batching import BatchPlan
from elastic_train.data.sampler import steps_per_epoch
from elastic_train.data.spec import Batch, DataBundle, StreamSplit, eval_batch_size
from elastic_train.data.trace import Trace
from elastic_train.errors import ConfigError

MATERIALIZE_SHARE = 0.25  # auto: materialise when the files take at most this share of the object store


def choose_mode(requested: str, id_column: str | None, data_bytes: int, store_bytes: float | None) -> tuple[str, str]:
    """``(mode, why)`` for ``data.ray_mode``; ``stream`` without an id column is a ConfigError."""
    if requested == "materialize":
        return "materialize", "data.ray_mode=materialize"
    if requested == "stream":
        if id_column is None:
            raise ConfigError("data.id_column", None, "data.ray_mode=stream needs a unique sample id column "
                              "(exactly once per epoch is checked by id)")
        return "stream", "data.ray_mode=stream"
    if id_column is None:
        return "materialize", "auto: no data.id_column to stream by"
    if store_bytes is None:
        return "materialize", "auto: object store size unknown"
    limit = MATERIALIZE_SHARE * store_bytes
    if data_bytes > limit:
        return "stream", f"auto: {data_bytes / 1e6:.1f} MB in memory > {limit / 1e6:.1f} MB (1/4 of the object store)"
    return "materialize", f"auto: {data_bytes / 1e6:.1f} MB in memory <= {limit / 1e6:.1f} MB (1/4 of the object store)"


def check_stream_batches(global_batch: int, min_workers: int, max_workers: int) -> None:
    """Streamed splits are equal in size, so every world size must divide the global batch evenly."""
    uneven = [w for w in range(min_workers, max_workers + 1) if global_batch % w]
    if uneven:
        raise ConfigError("train.global_batch_size", global_batch, f"a streamed data set (data.ray_mode=stream) "
                          f"needs it divisible by every world size; not by {uneven}")


def batch_tensors(batch: dict[str, np.ndarray], features: list[str], label: str,
                  feature_shape: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of columns (Ray Data's ``batch_format="numpy"``) as ``(x, y)``: the feature columns (fixed-size
    lists, tensors or scalars) flattened and stacked into one float32 input per row, reshaped to
    ``feature_shape``; the label as int64."""
    n = len(batch[label])
    feats = []
    for c in features:
        col = batch[c]
        if col.dtype == object:
            col = np.stack([np.asarray(v) for v in col]) if n else np.zeros((0, 1))
        feats.append(col.reshape(n, -1).astype(np.float32))
    x = torch.from_numpy(np.concatenate(feats, axis=1) if len(feats) > 1 else feats[0])
    if feature_shape:
        x = x.reshape(n, *feature_shape)
    return x, torch.from_numpy(np.asarray(batch[label]).astype(np.int64))


class ConsumedIds:
    """The ids one rank consumed in the epoch in progress, per step (a step prepared ahead is not yet consumed)."""

    def __init__(self) -> None:
        self.epoch = -1
        self.before = np.zeros(0, dtype=np.int64)  # every rank's ids before this attempt's first step (restored)
        self.steps: dict[int, np.ndarray] = {}

    def start(self, epoch: int, before: np.ndarray | None = None) -> None:
        self.epoch, self.steps = epoch, {}
        self.before = np.zeros(0, dtype=np.int64) if before is None else np.asarray(before)

    def add(self, step: int, ids: np.ndarray) -> None:
        self.steps[step] = np.asarray(ids)

    def local(self, epoch: int, step_in_epoch: int) -> np.ndarray:
        """This rank's ids of ``epoch``'s steps before ``step_in_epoch`` (in this attempt)."""
        if epoch != self.epoch:
            return np.zeros(0, dtype=np.int64)
        parts = [ids for s, ids in sorted(self.steps.items()) if s < step_in_epoch]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def position(self, epoch: int, step_in_epoch: int, gathered: list[np.ndarray]) -> dict[str, Any]:
        """The state a checkpoint keeps: every rank's ``local`` parts (``gathered``) plus the restored ones."""
        if step_in_epoch == 0:
            return {"epoch": epoch, "step": 0, "ids": np.zeros(0, dtype=np.int64)}
        parts = ([self.before] if epoch == self.epoch else []) + [np.asarray(g) for g in gathered]
        ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return {"epoch": epoch, "step": step_in_epoch, "ids": ids}


class StreamData:
    """One worker's micro-batches from a streamed split (see the module docstring); WorkerData's interface."""

    VAL_CACHE_MAX_BYTES = 512 << 20

    def __init__(self, bundle: DataBundle, plan: BatchPlan, rank: int, seed: int, device: torch.device,
                 trace_path: str | None = None):
        assert isinstance(bundle.train, StreamSplit) and isinstance(bundle.val, StreamSplit)
        self.bundle, self.plan, self.rank, self.seed, self.device = bundle, plan, rank, seed, device
        self.source = bundle.train.source
        self.prefetch_batches = getattr(self.source, "prefetch_batches", 1)
        self.shuffle_buffer = getattr(self.source, "shuffle_buffer", None)
        self.consumed = ConsumedIds()
        self._restored: dict[str, Any] | None = None
        self._val_cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._held: dict[str, Any] = {}  # rank 0 keeps each split (its coordinator actor) alive while it is read
        # Splits this rank has read to the end. Another rank may still be reading its tail of the same split, and
        # the coordinator dies with rank 0's last reference (the other ranks' copies came over torch.distributed,
        # outside Ray's reference counting): a slower rank 1 failed with "all references to the actor were
        # removed" and the run restarted. Dropped once the next step has run, whose all-reduce every rank reaches
        # only after finishing what it read before it.
        self._finished: list[Any] = []
        self._ahead: _Ahead | None = None  # the next epoch, started half-way through this one
        # The first validation, started after this attempt's first step (see epoch()), and how many validation
        # passes this process has read: the same on every rank, so the collective split agrees.
        self._val_ahead: _Ahead | None = None
        self._val_passes = 0
        self.trace = Trace(trace_path, rank, plan.world_size)

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(len(self.bundle.train), self.plan.global_batch_size)

    # ------------------------------------------------------------------------------ position (checkpoints)
    def position(self, epoch: int, step_in_epoch: int) -> dict[str, Any]:
        """A collective: every rank's consumed ids of the epoch in progress, gathered (rank 0 saves them)."""
        local = self.consumed.local(epoch, step_in_epoch) if step_in_epoch else np.zeros(0, dtype=np.int64)
        gathered: list[Any] = [local]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, local)
        return self.consumed.position(epoch, step_in_epoch, gathered)

    def restore(self, position: dict[str, Any] | None) -> None:
        self._restored = position

    def _excluded(self, epoch: int, start_step: int) -> np.ndarray | None:
        if start_step == 0:
            return None
        pos = self._restored
        if pos is None or pos["epoch"] != epoch or pos["step"] != start_step:
            raise RuntimeError(f"cannot resume the stream at epoch {epoch} step {start_step}: the checkpoint holds "
                               f"no consumed ids for it ({None if pos is None else (pos['epoch'], pos['step'])})")
        ids = np.asarray(pos["ids"])
        want = start_step * self.plan.global_batch_size
        if len(ids) != want:
            raise RuntimeError(f"the checkpoint holds {len(ids)} consumed ids at step {start_step}, expected {want}")
        return ids

    # ------------------------------------------------------------------------------ reading
    def _my_iterator(self, part: str, epoch: int, exclude: np.ndarray | None, equal: bool,
                     hold: str | None = None) -> Any:
        world = self.plan.world_size
        shared = world > 1 and dist.is_available() and dist.is_initialized()
        # Rank 0 builds the split and broadcasts it; without a process group (one worker, unit tests) each rank
        # builds its own (a source whose split is deterministic gives every rank the same).
        splits = self.source.split(part, epoch, self.seed, world, exclude, equal) if self.rank == 0 or not shared \
            else None
        if shared:
            box = [splits]
            dist.broadcast_object_list(box, src=0)
            splits = box[0]
        self._held[hold or part] = splits
        return splits[self.rank]

    def epoch(self, epoch: int, start_step: int = 0, then: int | None = None) -> Iterator[tuple[int, list[Batch]]]:
        """Yield ``(step, micro-batches)`` from ``start_step``: this rank's slice of each global batch, streamed.

        ``then``: the epoch the loop asks for next (None: none). Half-way through this one, its execution is
        started (see :class:`_Ahead`), so the next epoch's first batch does not wait for Ray Data's start-up."""
        exclude = self._excluded(epoch, start_step)
        self.consumed.start(epoch, exclude)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.epoch == epoch and start_step == 0:
            self._held["train"] = self._held.pop("train-ahead", None)
            rows = ahead.rows()
        else:
            self._held.pop("train-ahead", None)
            rows = self._rows(self._my_iterator("train", epoch, exclude, equal=True), epoch)
        b = self.plan.local_batch_size(self.rank)
        lo = self.plan.slice_bounds(self.rank)[0]
        pin = self.device.type == "cuda"
        ahead_at = max(start_step, self.steps_per_epoch // 2)
        for step in range(start_step, self.steps_per_epoch):
            if then is not None and step == ahead_at:  # the same step on every rank: the split is a collective
                self._ahead = _Ahead(then, self._rows(self._my_iterator("train", then, None, True, "train-ahead"),
                                                      then))
            if step == start_step + 1 and self._val_passes == 0 and self._val_ahead is None:
                # the first validation's Ray Data start-up (its split coordinator, file listing, read tasks) runs
                # while training goes on, as the next epoch's does: it cost ~8 s at the first checkpoint on 2 cores
                val_batch = eval_batch_size(self.bundle.spec, self.plan.micro_batch_size)
                self._val_ahead = _Ahead(0, self._val_rows(val_batch), batch_size=val_batch)
            got = next(rows, None)
            if got is None or len(got[2]) < b:
                raise RuntimeError(f"rank {self.rank}: the stream ran out at epoch {epoch} step {step} "
                                   f"(did the data change since the run counted {len(self.bundle.train)} rows?)")
            x, y, ids = got
            self.consumed.add(step, ids)
            self._record(epoch, step, ids)
            micro = []
            for a, z in self.plan.micro_slices(self.rank):
                if z > a:
                    xs, ys = x[a - lo:z - lo], y[a - lo:z - lo]
                    if pin:
                        xs, ys = xs.pin_memory(), ys.pin_memory()
                    micro.append((xs.to(self.device, non_blocking=True), ys.to(self.device, non_blocking=True)))
            yield step, micro
            self._finished.clear()  # the step ran on every rank (see __init__)
        for _ in rows:  # the ragged tail (< G rows over all ranks): read to the end so the split finishes
            pass
        self._finished.append(self._held.pop("train", None))

    def _rows(self, it: Any, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        shuffle_seed = (self.seed * 1_000_003 + epoch) * 1009 + self.rank
        return self.source.batches(it, self.plan.local_batch_size(self.rank), self.prefetch_batches,
                                   self.shuffle_buffer, shuffle_seed)

    def val_batches(self, batch_size: int, equal_counts: bool = False) -> Iterator[Batch]:
        """This worker's part of the validation stream (the parts cover it exactly once). The first pass keeps
        this rank's part in host memory when it is at most ``VAL_CACHE_MAX_BYTES``; later checkpoints reuse it
        instead of starting a Ray Data execution each time."""
        if equal_counts:
            raise RuntimeError("a streamed validation set cannot give every rank the same batch count (FSDP)")
        if self._val_cache is not None:
            for x, y in self._val_cache:
                yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            return
        ahead, self._val_ahead = self._val_ahead, None
        if ahead is not None and ahead.batch_size == batch_size:
            rows = ahead.rows()
        else:  # not started ahead (validation before the second step), or for another batch size (all ranks alike)
            rows = self._val_rows(batch_size)
        cache: list[tuple[torch.Tensor, torch.Tensor]] | None = []
        size = 0
        for x, y, _ in rows:
            if cache is not None:
                size += x.nbytes + y.nbytes
                if size <= self.VAL_CACHE_MAX_BYTES:
                    cache.append((x, y))
                else:
                    cache = None
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        self._finished.append(self._held.pop("val", None))
        self._val_passes += 1
        # Kept only where every rank keeps its part: a rank reading from its cache while another builds a new
        # split (a collective) would pair that broadcast with the validation's all-reduce.
        self._val_cache = cache if self._all_ranks(cache is not None) else None

    def _val_rows(self, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        """This rank's part of a new validation split (a collective: every rank calls it at the same point)."""
        it = self._my_iterator("val", 0, None, equal=False)
        return self.source.batches(it, batch_size, self.prefetch_batches, None, None)

    def _all_ranks(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (a collective where there is a process group)."""
        if not (self.plan.world_size > 1 and dist.is_available() and dist.is_initialized()):
            return flag
        t = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())

    # ------------------------------------------------------------------------------ trace
    def _record(self, epoch: int, step: int, ids: np.ndarray) -> None:
        if self.trace.enabled:
            self.trace.step(epoch, step, np.asarray(ids).tolist(), stream=True)

    def mark(self, event: dict[str, Any]) -> None:
        self.trace.mark(event)

    def close(self) -> None:
        self._ahead = self._val_ahead = None
        self._held.clear()
        self._finished.clear()
        self.trace.close()


class _Ahead:
    """The next epoch's rows, started early: a thread pulls its first batch while this epoch trains.

    A streamed epoch is a new Ray Data execution (a split coordinator, file listing, read and preprocess tasks,
    their worker processes), and its first batch used to come seconds after the previous epoch's last one
    (bench/ingest.py: ~3.5 s of a 14 s epoch, a heavy preprocess on 2 cores; 2 s of a 2.2 s light one). Pulling
    one batch starts the execution; Ray Data then runs it ahead up to its own backpressure limits, so the early
    start costs a bounded amount of memory and CPU that the next epoch needs anyway. Nothing about the order
    changes: the split is the one ``epoch(then)`` would build (no ids excluded: a fresh epoch), and a restart
    simply drops it (the process and the split's coordinator go with the worker group)."""

    def __init__(self, epoch: int, rows: Iterator[Any], batch_size: int | None = None):
        self.epoch, self._rows, self.batch_size = epoch, rows, batch_size
        self._first: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._pull, name=f"stream-epoch-{epoch}", daemon=True)
        self._thread.start()

    def _pull(self) -> None:
        try:
            self._first = next(self._rows, None)
        except BaseException as e:  # handed to the training thread, which raises it
            self._error = e

    def rows(self) -> Iterator[Any]:
        """The epoch's rows: the first one pulled ahead (waited for, as any batch is), then the rest."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._first is not None:
            yield self._first
            yield from self._rows
