"""GPU check of the streamed path (data.ray_mode=stream): pinned memory, device placement, next-epoch lookahead.

    python bench/gpu_stream.py            # one NVIDIA GPU, ~1 min
    python bench/gpu_stream.py --smoke    # the CPU, seconds: the same code paths, no goals

Needs torch and NumPy only (no Ray): Ray Data's part, a ``streaming_split`` iterator handing each worker
batches of NumPy columns (``iter_batches(batch_format="numpy")``) with a per-epoch start-up, is played by
:class:`TableSource` over an in-memory table. Everything after that is the engine's own: StreamData (the
exactly-once bookkeeping, the next epoch started half-way through this one), ``batch_tensors`` (columns ->
tensors), pinning and the non-blocking copy to the GPU, and the loop's ``train_step`` with bf16 autocast,
against the same model and rows fed by the in-memory path (WorkerData: the set resident on the GPU).

Prints JSON: samples/s and data-wait share of each side over ``--epochs`` epochs, their ratio, and the checks:
every micro-batch on the training device, every training id exactly once per epoch, the loss finite.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import WorkerData
from elastic_train.data.spec import DataBundle, DataSpec, StreamSplit, TensorSet
from elastic_train.data.stream import StreamData, batch_tensors
from elastic_train.models.registry import SmallCNN
from elastic_train.train.loop import Precision, train_step


class TableSource:
    """Ray Data's role: per epoch, the rows (less ``exclude``) in a seeded order, cut into ``world`` equal parts;
    each part served as NumPy column batches after ``startup_s`` (an execution's start-up: coordinator, listing,
    read tasks), converted by the engine's ``batch_tensors``."""

    def __init__(self, table: dict[str, np.ndarray], shape: list[int], startup_s: float):
        self.table, self.shape, self.startup_s = table, shape, startup_s
        self.prefetch_batches, self.shuffle_buffer = 1, None

    def split(self, part: str, epoch: int, seed: int, world: int, exclude: Any, equal: bool) -> list[np.ndarray]:
        rows = np.random.default_rng([seed, epoch]).permutation(len(self.table["id"]))
        if exclude is not None and len(exclude):
            rows = rows[~np.isin(self.table["id"][rows], exclude)]
        m = len(rows) // world
        return [rows[r * m:(r + 1) * m] for r in range(world)]

    def batches(self, rows: np.ndarray, batch_size: int, prefetch: int, shuffle_buffer: Any, seed: Any):
        time.sleep(self.startup_s)
        for a in range(0, len(rows), batch_size):
            idx = rows[a:a + batch_size]
            cols = {k: v[idx] for k, v in self.table.items()}  # a fresh host copy per batch, as Ray Data hands out
            x, y = batch_tensors(cols, ["x"], "label", self.shape)
            yield x, y, cols["id"]


def run(data: Any, model: torch.nn.Module, plan: BatchPlan, device: torch.device, epochs: int,
        check_ids: bool, lookahead: bool = True) -> dict[str, Any]:
    precision = Precision.create("bf16" if device.type == "cuda" else "fp32", device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    wait, samples, off_device, seen, loss = 0.0, 0, 0, [], 0.0
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        ids: list[torch.Tensor] = []  # on the device: reading them per step would sync the host every step
        steps = data.epoch(epoch, 0, epoch + 1 if lookahead and epoch + 1 < epochs else None)
        while True:
            tw = time.perf_counter()
            item = next(steps, None)
            wait += time.perf_counter() - tw
            if item is None:
                break
            step, micro = item
            off_device += sum(x.device != device or y.device != device for x, y in micro)
            r = train_step(model, micro, opt, sched, precision, plan.loss_scale, 1.0)
            samples += sum(len(y) for _, y in micro)
            if check_ids:
                ids += [x.reshape(len(x), -1)[:, 0] for x, _ in micro]
        loss = float(r.loss_sum) / max(r.samples, 1)
        seen.append([int(v) for v in torch.cat(ids).tolist()] if ids else [])
    sync()
    wall = time.perf_counter() - t0
    return {"samples_per_s": samples / wall, "wall_s": wall, "data_wait_share": wait / wall,
            "micro_batches_off_device": off_device, "ids": seen, "last_loss": loss}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--global-batch", type=int, default=256)
    ap.add_argument("--startup-s", type=float, help="a stream epoch's simulated execution start-up (default 1 s; "
                                                    "smoke 0)")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not a.smoke
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    rows = a.rows or (100_000 if cuda else 2_000)
    startup_s = a.startup_s if a.startup_s is not None else (1.0 if cuda else 0.0)
    shape, channels = ([3, 64, 64], [64, 128, 256]) if cuda else ([3, 16, 16], [8, 16])
    gen = np.random.default_rng(0)
    n_feat = int(np.prod(shape))
    table = {"id": np.arange(rows, dtype=np.int64),
             "x": gen.standard_normal((rows, n_feat), dtype=np.float32),
             "label": gen.integers(0, 10, rows).astype(np.int64)}
    table["x"][:, 0] = table["id"]  # the id rides in the first feature, so the check reads it off the batch
    spec = DataSpec("classification", tuple(shape), 10)
    plan = BatchPlan(a.global_batch, 1, None)
    out: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "rows": rows,
                           "epochs": a.epochs, "global_batch": a.global_batch, "input_shape": shape,
                           "stream_startup_s": startup_s}
    sides = {}
    for side in ("in_memory", "stream", "stream_no_lookahead") * 2:  # alternated, the last of each kept
        torch.manual_seed(0)
        model = SmallCNN(shape[0], channels, 10).to(device).to(memory_format=torch.channels_last)
        if side == "in_memory":
            xs, ys = batch_tensors(table, ["x"], "label", shape)
            bundle = DataBundle(TensorSet(xs, ys), TensorSet(xs[:256], ys[:256]), spec)
            data: Any = WorkerData(bundle, plan, 0, 0, device, 0)
        else:
            src = TableSource(table, shape, startup_s)
            split = StreamSplit(src, rows, table["x"][:1])
            data = StreamData(DataBundle(split, StreamSplit(src, rows, table["x"][:1], "val"), spec), plan, 0, 0,
                              device)
        sides[side] = run(data, model, plan, device, a.epochs, check_ids=side == "stream",
                          lookahead=side != "stream_no_lookahead")
        data.close()
    ids = sides["stream"].pop("ids")
    sides["in_memory"].pop("ids")
    sides["stream_no_lookahead"].pop("ids")
    per_epoch = rows // a.global_batch * a.global_batch
    out.update({k: {m: (round(v, 4) if isinstance(v, float) else v) for m, v in s.items()} for k, s in sides.items()})
    base = sides["in_memory"]["samples_per_s"]
    out["ratio_stream_vs_in_memory"] = round(sides["stream"]["samples_per_s"] / base, 3)
    out["ratio_stream_no_lookahead_vs_in_memory"] = round(sides["stream_no_lookahead"]["samples_per_s"] / base, 3)
    out["checks"] = {
        "every_micro_batch_on_device": sides["stream"]["micro_batches_off_device"] == 0,
        "every_id_once_per_epoch": all(len(e) == len(set(e)) == per_epoch for e in ids),
        "loss_finite": bool(np.isfinite(sides["stream"]["last_loss"])),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0 if all(out["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
