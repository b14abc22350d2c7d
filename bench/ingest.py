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

    .venv/bin/python bench/ingest.py --heavy [--smoke] [--train-cores N]

A deliberately CPU-heavy preprocess (:func:`bench.heavy_preprocess.augment`: each 8x8 image upsampled to
64x64, flipped by id, blurred by FFT 12 times and pooled back; about half a millisecond a sample), on a 2-node
``ray.cluster_utils.Cluster`` whose nodes sit on disjoint cores of this machine (CPU affinity): a training node
(the first N cores: the training loop) and a CPU node (the other cores):

    dataloader_heavy   the map-style Dataset applies it per sample in N DataLoader worker processes, on the
                       training node's cores (where a DataLoader's workers run)
    ray_stream_heavy   Ray Data applies it as ``data.preprocess`` (map_batches over blocks of
                       data.preprocess_block_rows rows) on both nodes' CPUs while the training loop streams
                       (data.ray_mode=stream)
"""

from __future__ import annotations

import argparse
import json
import os
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

from bench.heavy_preprocess import augment  # noqa: E402

G = 128


class MapStyle(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


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


def train_epoch(bundle, loader_workers: int, epochs: int = 1) -> dict[str, float]:
    """Train ``epochs`` epochs (the engine's loop asks a stream for the next epoch half-way through this one, so
    does this). ``samples_per_s`` and ``data_wait_share`` cover them all; with more than one epoch,
    ``steady_samples_per_s`` covers the epochs after the first (a long run's rate: a stream's first epoch alone
    pays its execution's start)."""
    from elastic_train.data.batching import BatchPlan
    from elastic_train.data.loader import worker_data

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = worker_data(bundle, BatchPlan(G, 1, None), 0, 0, torch.device("cpu"), loader_workers=loader_workers)
    wait, samples, per_epoch = 0.0, 0, []
    t0 = time.perf_counter()
    try:
        for epoch in range(epochs):
            te, n = time.perf_counter(), samples
            it = data.epoch(epoch, 0, epoch + 1 if epoch + 1 < epochs else None)
            try:
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
            finally:  # a Ray Data iterator left open re-initialises Ray from its finaliser once the cluster is gone
                it.close()
            per_epoch.append((samples - n, time.perf_counter() - te))
    finally:
        data.close()
    wall = time.perf_counter() - t0
    out = {"samples_per_s": samples / wall, "wall_s": wall, "data_wait_share": wait / wall}
    if epochs > 1:
        out["steady_samples_per_s"] = sum(n for n, _ in per_epoch[1:]) / sum(t for _, t in per_epoch[1:])
        out["first_epoch_s"] = per_epoch[0][1]
    return out


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def pin_tree(pids: list[int], cores: set[int]) -> int:
    """CPU affinity ``cores`` for ``pids`` and all their descendants (new children inherit it); how many."""
    kids, todo, done = _children(), list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in done:
            continue
        done.add(pid)
        try:
            os.sched_setaffinity(pid, cores)
        except OSError:  # gone already
            pass
        todo.extend(kids.get(pid, []))
    return len(done)


def node_pids(node) -> list[int]:  # a ray._private.node.Node
    return [p.process.pid for procs in node.all_processes.values() for p in procs if p.process is not None]


class TwoNodes:
    """A 2-node ``ray.cluster_utils.Cluster`` on one machine, its nodes on disjoint cores by CPU affinity: the
    *training node* (the head, this process, its DataLoader workers: ``train_cores``) and a *CPU node* (the other
    cores). Each node's raylet tree is pinned, so the Ray workers it starts later inherit its cores."""

    def __init__(self, train_cores: set[int], cpu_cores: set[int]):
        import ray
        from ray.cluster_utils import Cluster

        self.train_cores, self.cpu_cores = train_cores, cpu_cores
        os.sched_setaffinity(0, train_cores)
        torch.set_num_threads(len(train_cores))
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": len(train_cores), "include_dashboard": False})
        self.cpu_node = self.cluster.add_node(num_cpus=len(cpu_cores))
        self.cluster.wait_for_nodes(timeout=60)
        ray.init(address=self.cluster.address, logging_level="ERROR")
        self.pin()

    def pin(self) -> None:
        pin_tree(node_pids(self.cluster.head_node), self.train_cores)
        pin_tree(node_pids(self.cpu_node), self.cpu_cores)

    def stop(self) -> None:
        import ray

        ray.shutdown()
        self.cluster.shutdown()


def heavy(rows: int, repeats: int, train_cores: int, block_rows: int, epochs: int) -> dict:
    """DataLoader workers on the training node vs Ray Data's preprocess on the training node's and a CPU node's
    CPUs, on the heavy preprocess (see the module docstring)."""
    from elastic_train import config
    from elastic_train.data.ray_source import build_ray
    from elastic_train.data.spec import DataBundle, DataSpec

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= train_cores:
        raise SystemExit(f"--train-cores {train_cores}: this machine has {len(cores)} core(s); a CPU node needs one")
    train, cpu = set(cores[:train_cores]), set(cores[train_cores:])
    world = TwoNodes(train, cpu)
    try:
        x, y = (torch.from_numpy(a) for a in digits(rows))
        spec = DataSpec("classification", (64,), 10)
        mapstyle = DataBundle(HeavyMapStyle(x, y), HeavyMapStyle(x[:G], y[:G]), spec)
        results: dict[str, list[dict[str, float]]] = {"dataloader_heavy": [], "ray_stream_heavy": []}
        with tempfile.TemporaryDirectory() as tmp:
            write_parquet(Path(tmp), x.numpy(), y.numpy())
            cfg = config.compose({}, config.parse_overrides([
                "data.name=ray", f"data.path={tmp}", "data.features=[x]", "data.id_column=id",
                "data.val_fraction=0.01", "data.ray_mode=stream", "data.preprocess=bench.heavy_preprocess:heavy_batch",
                f"data.preprocess_concurrency={len(cores)}", f"data.preprocess_block_rows={block_rows}"]))
            t0 = time.perf_counter()
            bundle = build_ray(cfg)  # the driver's counting pass runs the preprocess once (the ids come after it)
            count_s = time.perf_counter() - t0
            for _ in range(repeats):  # alternate the sides
                world.pin()  # workers Ray started since
                results["dataloader_heavy"].append(train_epoch(mapstyle, train_cores, epochs))
                world.pin()
                results["ray_stream_heavy"].append(train_epoch(bundle, 0, epochs))
    finally:
        world.stop()
    med = {side: {k: round(statistics.median(run[k] for run in runs), 4) for k in runs[0]}
           for side, runs in results.items()}
    return {
        "rows": rows, "repeats": repeats, "epochs": epochs, "global_batch": G, "preprocess_block_rows": block_rows,
        "training_node": {"cores": sorted(train), "dataloader_workers": train_cores,
                          "ray_cpus": len(train)},
        "cpu_node": {"cores": sorted(cpu), "ray_cpus": len(cpu)},
        "measured": f"median over repeats; sides alternate; {epochs} epoch(s) each; two Ray nodes on disjoint "
                    "cores of one machine (CPU affinity)",
        **med,
        "ray_stream_counting_pass_s": round(count_s, 2),
        "ratio_ray_stream_heavy_vs_dataloader_heavy": round(
            med["ray_stream_heavy"]["samples_per_s"] / med["dataloader_heavy"]["samples_per_s"], 3),
        **({"ratio_steady_ray_stream_heavy_vs_dataloader_heavy": round(
            med["ray_stream_heavy"]["steady_samples_per_s"] / med["dataloader_heavy"]["steady_samples_per_s"], 3)}
           if epochs > 1 else {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--heavy", action="store_true", help="the CPU-heavy preprocess: DataLoader vs Ray Data")
    ap.add_argument("--train-cores", type=int, default=1,
                    help="--heavy: cores of the training node (= its DataLoader workers); the rest are a CPU node")
    ap.add_argument("--block-rows", type=int, default=1024, help="--heavy: data.preprocess_block_rows")
    ap.add_argument("--epochs", type=int, default=None,
                    help="epochs per side and repeat (--heavy: 3, --smoke 2; else 1); more than one also reports "
                         "the rate after the first epoch (steady_samples_per_s)")
    args = ap.parse_args()
    if args.heavy:
        epochs = args.epochs or (2 if args.smoke else 3)
        print(json.dumps(heavy(*((4_000, 2) if args.smoke else (20_000, 3)), args.train_cores, args.block_rows,
                               epochs), indent=2))
        return
    rows, repeats = (8_000, 2) if args.smoke else (200_000, 3)
    epochs = args.epochs or 1

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
                results["in_memory"].append(train_epoch(mem, 0, epochs))
                results["dataloader"].append(train_epoch(mapstyle, 2, epochs))
                for side, c in (("ray_data", cfg), ("ray_stream", stream_cfg)):
                    t0 = time.perf_counter()
                    bundle = build_ray(c)
                    read_s = time.perf_counter() - t0
                    r = train_epoch(bundle, 0, epochs)
                    total = r["wall_s"] + read_s
                    results[side].append({**r, "read_s": read_s,
                                          "samples_per_s_with_read": r["samples_per_s"] * r["wall_s"] / total})
    finally:
        ray.shutdown()
    med = {side: {k: statistics.median(run[k] for run in runs) for k in runs[0]} for side, runs in results.items()}
    base = med["dataloader"]["samples_per_s"]
    out = {
        "rows": rows, "repeats": repeats, "epochs": epochs, "global_batch": G,
        "measured": "median over repeats; sides alternate",
        **{side: {k: round(v, 4) for k, v in m.items()} for side, m in med.items()},
        "ratio_in_memory_vs_dataloader": round(med["in_memory"]["samples_per_s"] / base, 3),
        "ratio_ray_data_vs_dataloader": round(med["ray_data"]["samples_per_s"] / base, 3),
        "ratio_ray_data_with_read_vs_dataloader": round(med["ray_data"]["samples_per_s_with_read"] / base, 3),
        "ratio_ray_stream_vs_dataloader": round(med["ray_stream"]["samples_per_s"] / base, 3),
        "ratio_ray_stream_with_read_vs_dataloader": round(med["ray_stream"]["samples_per_s_with_read"] / base, 3),
        **({"ratio_steady_ray_stream_vs_dataloader": round(
            med["ray_stream"]["steady_samples_per_s"] / med["dataloader"]["steady_samples_per_s"], 3)}
           if epochs > 1 else {}),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
