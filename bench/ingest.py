"""Ingest: training samples/s fed by the in-memory path, the DataLoader path and Ray Data (data.name=ray). JSON.

    .venv/bin/python bench/ingest.py --smoke      # < 2 min on 2 loaded cores
    .venv/bin/python bench/ingest.py              # more rows and repeats

One data set on every side: scikit-learn's digits tiled to N rows (64 float features, 10 classes), the same
MLP (64-256-256-10), SGD, global batch 128, one worker in this process. Each side trains one epoch through the
engine's own WorkerData (the sampler, micro-batches, prefetch):

    in_memory   a TensorSet (what the built-in sets use)
    dataloader  a map-style torch Dataset read per sample by a DataLoader with 2 worker processes
    ray_data    Parquet files read by Ray Data (elastic_train.data.ray_source: read, materialise, sort by id),
                then trained as an in-memory set; its read time is reported and also charged to the epoch
    ray_stream  the same files streamed (data.ray_mode=stream: elastic_train.data.stream, one worker, its own
                streaming_split); the driver's counting pass is reported as read_s and charged likewise

Sides alternate, repeated; medians. ``data_wait_share`` is the part of the epoch spent waiting for batches
(time in the data iterator over the whole epoch). Ratios are against the DataLoader side, measured in the same run.

    .venv/bin/python bench/ingest.py --heavy [--smoke] [--cpus N]

A deliberately CPU-heavy preprocess (:func:`augment`: each 8x8 image upsampled to 64x64, flipped by id, blurred
by FFT 12 times and pooled back; about a millisecond a sample) on two sides with the same N spare CPUs:

    dataloader_heavy   the map-style Dataset applies it per sample in N DataLoader worker processes
    ray_stream_heavy   Ray Data applies it as ``data.preprocess`` (map_batches, N tasks of 1 CPU) while the
                       training loop streams (data.ray_mode=stream)

On one machine both sides share its cores, so Ray Data is not expected ahead here: it gets ahead when its
preprocess runs on CPU nodes other than the training node (a cluster), which a 2-core box cannot show.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

G = 128


class MapStyle(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


def augment(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The CPU-heavy preprocess: per sample, upsample 8x8 -> 64x64, flip by id parity, 12 FFT blurs, pool back."""
    out = np.empty_like(x)
    kernel = np.fft.rfft2(np.outer(np.hanning(64), np.hanning(64)))
    for i in range(len(x)):
        img = np.kron(x[i].reshape(8, 8), np.ones((8, 8), np.float32))
        if ids[i] % 2:
            img = img[:, ::-1]
        for _ in range(12):
            img = np.fft.irfft2(np.fft.rfft2(img) * kernel, s=img.shape)
            img /= max(float(np.abs(img).max()), 1e-6)
        out[i] = img.reshape(8, 8, 8, 8).mean(axis=(1, 3)).reshape(-1)
    return out


def heavy_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``data.preprocess`` for Ray Data: :func:`augment` over a batch of numpy columns."""
    x = np.stack(batch["x"]).astype(np.float32)
    return {**batch, "x": augment(x, batch["id"])}


class HeavyMapStyle(Dataset):
    """The DataLoader side: :func:`augment` per sample, in the DataLoader's worker processes."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x.numpy(), y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return torch.from_numpy(augment(self.x[i:i + 1], np.array([i]))[0]), self.y[i]


def digits(rows: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    reps = -(-rows // len(d.target))
    x = np.tile(d.data.astype(np.float32) / 16.0, (reps, 1))[:rows]
    y = np.tile(d.target.astype(np.int64), reps)[:rows]
    return x, y


def write_parquet(folder: Path, x: np.ndarray, y: np.ndarray, files: int = 4) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(y)
    for i in range(files):
        a, b = i * n // files, (i + 1) * n // files
        pq.write_table(pa.table({
            "id": pa.array(np.arange(a, b, dtype=np.int64)),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x[a:b].reshape(-1)), 64),
            "label": pa.array(y[a:b]),
        }), folder / f"part-{i}.parquet")


def train_epoch(bundle, loader_workers: int) -> dict[str, float]:
    from elastic_train.data.batching import BatchPlan
    from elastic_train.data.loader import worker_data

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = worker_data(bundle, BatchPlan(G, 1, None), 0, 0, torch.device("cpu"), loader_workers=loader_workers)
    wait, samples = 0.0, 0
    t0 = time.perf_counter()
    it = data.epoch(0)
    while True:
        tw = time.perf_counter()
        nxt = next(it, None)
        wait += time.perf_counter() - tw
        if nxt is None:
            break
        for x, y in nxt[1]:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            samples += len(y)
    wall = time.perf_counter() - t0
    data.close()
    return {"samples_per_s": samples / wall, "wall_s": wall, "data_wait_share": wait / wall}


def heavy(rows: int, repeats: int, cpus: int) -> dict:
    """Dataloader workers vs Ray Data preprocess tasks, the same spare CPUs each, on the heavy preprocess."""
    import ray

    from elastic_train import config
    from elastic_train.data.ray_source import build_ray
    from elastic_train.data.spec import DataBundle, DataSpec

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, logging_level="ERROR")
    try:
        x, y = (torch.from_numpy(a) for a in digits(rows))
        spec = DataSpec("classification", (64,), 10)
        mapstyle = DataBundle(HeavyMapStyle(x, y), HeavyMapStyle(x[:G], y[:G]), spec)
        results: dict[str, list[dict[str, float]]] = {"dataloader_heavy": [], "ray_stream_heavy": []}
        with tempfile.TemporaryDirectory() as tmp:
            write_parquet(Path(tmp), x.numpy(), y.numpy())
            cfg = config.compose({}, config.parse_overrides([
                "data.name=ray", f"data.path={tmp}", "data.features=[x]", "data.id_column=id",
                "data.val_fraction=0.01", "data.ray_mode=stream", "data.preprocess=bench.ingest:heavy_batch",
                f"data.preprocess_concurrency={cpus}"]))
            for _ in range(repeats):  # alternate the sides
                results["dataloader_heavy"].append(train_epoch(mapstyle, cpus))
                results["ray_stream_heavy"].append(train_epoch(build_ray(cfg), 0))
    finally:
        ray.shutdown()
    med = {side: {k: round(statistics.median(run[k] for run in runs), 4) for k in runs[0]}
           for side, runs in results.items()}
    return {
        "rows": rows, "repeats": repeats, "spare_cpus": cpus, "global_batch": G,
        "measured": "median over repeats; sides alternate; one machine (both sides share its cores)",
        **med,
        "ratio_ray_stream_heavy_vs_dataloader_heavy": round(
            med["ray_stream_heavy"]["samples_per_s"] / med["dataloader_heavy"]["samples_per_s"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--heavy", action="store_true", help="the CPU-heavy preprocess: DataLoader vs Ray Data")
    ap.add_argument("--cpus", type=int, default=2, help="--heavy: DataLoader workers = Ray Data preprocess tasks")
    args = ap.parse_args()
    if args.heavy:
        print(json.dumps(heavy(*((2_000, 2) if args.smoke else (20_000, 3)), args.cpus), indent=2))
        return
    rows, repeats = (8_000, 2) if args.smoke else (200_000, 3)

    import ray

    from elastic_train import config
    from elastic_train.data.spec import DataBundle, DataSpec, TensorSet

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        x, y = torch.from_numpy(digits(rows)[0]), torch.from_numpy(digits(rows)[1])
        spec = DataSpec("classification", (64,), 10)
        mem = DataBundle(TensorSet(x, y), TensorSet(x[:G], y[:G]), spec)
        mapstyle = DataBundle(MapStyle(x, y), MapStyle(x[:G], y[:G]), spec)
        with tempfile.TemporaryDirectory() as tmp:
            write_parquet(Path(tmp), x.numpy(), y.numpy())
            ray_args = ["data.name=ray", f"data.path={tmp}", "data.features=[x]", "data.id_column=id",
                        "data.val_fraction=0.01"]
            cfg = config.compose({}, config.parse_overrides([*ray_args, "data.ray_mode=materialize"]))
            stream_cfg = config.compose({}, config.parse_overrides([*ray_args, "data.ray_mode=stream"]))
            from elastic_train.data.ray_source import build_ray

            results: dict[str, list[dict[str, float]]] = {"in_memory": [], "dataloader": [], "ray_data": [],
                                                          "ray_stream": []}
            for _ in range(repeats):  # alternate the sides
                results["in_memory"].append(train_epoch(mem, 0))
                results["dataloader"].append(train_epoch(mapstyle, 2))
                for side, c in (("ray_data", cfg), ("ray_stream", stream_cfg)):
                    t0 = time.perf_counter()
                    bundle = build_ray(c)
                    read_s = time.perf_counter() - t0
                    r = train_epoch(bundle, 0)
                    total = r["wall_s"] + read_s
                    results[side].append({**r, "read_s": read_s,
                                          "samples_per_s_with_read": r["samples_per_s"] * r["wall_s"] / total})
    finally:
        ray.shutdown()
    med = {side: {k: statistics.median(run[k] for run in runs) for k in runs[0]} for side, runs in results.items()}
    base = med["dataloader"]["samples_per_s"]
    out = {
        "rows": rows, "repeats": repeats, "global_batch": G, "measured": "median over repeats; sides alternate",
        **{side: {k: round(v, 4) for k, v in m.items()} for side, m in med.items()},
        "ratio_in_memory_vs_dataloader": round(med["in_memory"]["samples_per_s"] / base, 3),
        "ratio_ray_data_vs_dataloader": round(med["ray_data"]["samples_per_s"] / base, 3),
        "ratio_ray_data_with_read_vs_dataloader": round(med["ray_data"]["samples_per_s_with_read"] / base, 3),
        "ratio_ray_stream_vs_dataloader": round(med["ray_stream"]["samples_per_s"] / base, 3),
        "ratio_ray_stream_with_read_vs_dataloader": round(med["ray_stream"]["samples_per_s_with_read"] / base, 3),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
