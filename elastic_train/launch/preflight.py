"""Preflight: check the plan against the cluster before acquiring anything (DESIGN invariant 7).

Two stages. :func:`check_static` needs no cluster: it builds the dataset and the model on the driver, so a
bad name, import path or shape fails here. :func:`check_cluster` then asks Ray what exists: nodes, CPUs,
GPUs (and what ``torch.cuda.device_count()`` sees on each GPU node), whether the requested workers fit,
and whether the storage path is writable and visible from every node. Problems raise ConfigError naming
the field; soft problems become warnings in the report.
"""

from __future__ import annotations

import math
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from elastic_train.compat import features
from elastic_train.config import ConfigError, JobConfig
from elastic_train.data import DataBundle, build_data, describe, filesystems
from elastic_train.data.batching import BatchPlan
from elastic_train.data.sampler import steps_per_epoch
from elastic_train.launch.versions import versions_line
from elastic_train.models import build_model, count_parameters
from elastic_train.train.budget import Budget


@dataclass
class NodeInfo:
    node_id: str
    address: str
    cpus: float
    gpus: float
    torch_gpus: int | None = None  # torch.cuda.device_count() on that node (GPU nodes only)


@dataclass
class PreflightReport:
    nodes: list[NodeInfo]
    use_gpu: bool
    resources_per_worker: dict[str, float]
    fit_workers: int
    requested: tuple[int, int]
    storage_path: str
    storage_shared: bool | None
    plans: list[BatchPlan]
    data: dict[str, Any]
    model_parameters: int
    warnings: list[str] = field(default_factory=list)
    spare_workers: int | str = 0  # failure.spare_workers (train/spares.py)
    spares_after_s: float = 0.0
    versions: str = ""  # the Ray, MLflow, torch and Python versions (launch/versions.py)
    internals: str | None = None  # features of compat/features.py this run cannot use, or the switch off

    @property
    def total_cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def total_gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [vars(n) for n in self.nodes],
            "cpus": self.total_cpus,
            "gpus": self.total_gpus,
            "use_gpu": self.use_gpu,
            "resources_per_worker": self.resources_per_worker,
            "workers_that_fit": self.fit_workers,
            "requested_workers": list(self.requested),
            "storage_path": self.storage_path,
            "storage_shared": self.storage_shared,
            "batch_plans": [p.describe() for p in self.plans],
            "data": self.data,
            "model_parameters": self.model_parameters,
            "spare_workers": self.spare_workers,
            "versions": self.versions,
            "internals": self.internals,
            "warnings": self.warnings,
        }

    def render(self) -> str:
        lo, hi = self.requested
        lines = [f"preflight: {len(self.nodes)} node(s), {self.total_cpus:g} CPUs, {self.total_gpus:g} GPUs"]
        lines += [f"  {line}" for line in (self.versions, self.internals) if line]
        for n in self.nodes:
            seen = f", torch sees {n.torch_gpus}" if n.torch_gpus is not None else ""
            lines.append(f"  node {n.address:<15} {n.cpus:>5g} CPU {n.gpus:>3g} GPU{seen}")
        want = f"{lo}" if lo == hi else f"{lo}..{hi} (elastic)"
        lines.append(
            f"  workers: {want} x {self.resources_per_worker} on {'GPU' if self.use_gpu else 'CPU'}; "
            f"{self.fit_workers} fit the cluster"
        )
        if self.spare_workers != 0:
            each = "one per worker" if self.spare_workers == "auto" else f"{self.spare_workers}"
            lines.append(f"  spares: {each} on each node from {self.spares_after_s:g} s into training, for a faster "
                         f"restart (~{SPARE_RSS_GB} GB of memory each, ~1 % of a core while idle; "
                         "failure.spare_workers=0: none)")
        shared = {True: "visible from every node", False: "NOT shared", None: "single node"}[self.storage_shared]
        lines.append(f"  storage: {self.storage_path} ({shared})")
        lines.append(f"  data: {self.data['train_samples']} train / {self.data['val_samples']} val samples; "
                     f"model: {self.model_parameters:,} parameters")
        if "files" in self.data:  # files read on the cluster (data.name=ray): where, and how big
            mode = (f"{'streamed' if self.data.get('mode') == 'stream' else 'materialised'} "
                    f"({self.data.get('mode_reason', '')})")
            if self.data.get("format") == "ray.data.Dataset":  # data.dataset: a user's function, size unknown
                lines.append(f"  data read from {self.data.get('source')} (a ray.data.Dataset); {mode}")
            else:
                lines.append(f"  data read from {self.data.get('source')}: {self.data['files']} "
                             f"{self.data.get('format')} file(s), {self.data.get('bytes', 0) / 1e6:.1f} MB "
                             f"({self.data.get('data_bytes', 0) / 1e6:.1f} MB in memory); {mode}")
        for p in self.plans:
            lines.append(f"  batch plan W={p.world_size}: {p}")
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------- static


SPARE_RSS_GB = 0.45  # a warm spare's resident memory on this project's machines (440 MB) (docs/faults.md#warm-spares)


def worker_resources(cfg: JobConfig, use_gpu: bool) -> dict[str, float]:
    res = dict(cfg.scaling.resources_per_worker or {"CPU": 1.0})
    if use_gpu:
        res.setdefault("GPU", 1.0)
    return res



def check_gpu_share(cfg: JobConfig) -> None:
    """Refuse a fraction of a GPU per worker when there can be two workers: Ray then places two ranks on one
    device, and NCCL refuses that ("Duplicate GPU detected") from inside the workers, after everything started."""
    gpu = (cfg.scaling.resources_per_worker or {}).get("GPU", 0.0)
    if cfg.scaling.use_gpu is not False and 0.0 < gpu < 1.0 and cfg.scaling.max_workers > 1:
        raise ConfigError(
            "scaling.resources_per_worker", cfg.scaling.resources_per_worker,
            f"GPU {gpu:g} per worker with up to {cfg.scaling.max_workers} workers puts two ranks on one GPU, which "
            "NCCL refuses; give each worker a whole GPU (GPU: 1) or train with one worker",
        )


def check_static(cfg: JobConfig) -> tuple[DataBundle, int]:
    """Build the data and the model once on the driver; ConfigError on any mistake."""
    check_gpu_share(cfg)
    bundle = build_data(cfg)
    Budget.of(cfg.train, steps_per_epoch(len(bundle.train), cfg.train.global_batch_size),
              bundle.spec.tokens_per_sample)  # a token budget below one step exits 2 here
    model = build_model(cfg, bundle.spec)
    return bundle, count_parameters(model)


def batch_plans(cfg: JobConfig, limit: int = 6) -> list[BatchPlan]:
    lo, hi = cfg.scaling.min_workers, cfg.scaling.max_workers
    sizes = list(range(lo, hi + 1))
    if len(sizes) > limit:
        sizes = sizes[: limit // 2] + sizes[-(limit // 2) :]
    return [BatchPlan(cfg.train.global_batch_size, w, cfg.train.micro_batch_size) for w in sizes]


# ---------------------------------------------------------------------------------------- cluster


def cluster_nodes() -> list[NodeInfo]:
    nodes = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        nodes.append(NodeInfo(n["NodeID"], n.get("NodeManagerAddress", "?"), res.get("CPU", 0.0), res.get("GPU", 0.0)))
    return nodes


def workers_that_fit(nodes: list[NodeInfo], per_worker: dict[str, float], totals: list[dict[str, float]]) -> int:
    """How many workers the cluster could place if it were idle (per node, the scarcest resource)."""
    fit = 0
    for node_res in totals:
        per_node = min(
            (math.floor(node_res.get(k, 0.0) / v + 1e-9) for k, v in per_worker.items() if v > 0), default=0
        )
        fit += per_node
    return fit


def check_cluster(cfg: JobConfig, storage_path: str, bundle: DataBundle, n_params: int) -> PreflightReport:
    """Compare the request with the connected cluster. Requires ``ray.init`` to have run."""
    report = _cluster_report(cfg, storage_path, describe(bundle), n_params)
    if report.use_gpu and report.total_gpus == 0 and not cfg.scaling.autoscaling:
        raise ConfigError("scaling.use_gpu", cfg.scaling.use_gpu, "the cluster has no GPUs")
    _check_fit(cfg, report)
    _check_stream_cpus(cfg, report)
    if report.use_gpu:
        _probe_torch_gpus(report)
    report.storage_shared = check_storage(storage_path, report.nodes)
    return report


def _cluster_report(cfg: JobConfig, storage_path: str, data: dict[str, Any], n_params: int) -> PreflightReport:
    nodes = cluster_nodes()
    totals = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    gpus = sum(n.gpus for n in nodes)
    use_gpu = cfg.scaling.use_gpu if isinstance(cfg.scaling.use_gpu, bool) else gpus > 0
    per_worker = worker_resources(cfg, use_gpu)
    return PreflightReport(
        nodes=nodes,
        use_gpu=use_gpu,
        resources_per_worker=per_worker,
        fit_workers=workers_that_fit(nodes, per_worker, totals),
        requested=(cfg.scaling.min_workers, cfg.scaling.max_workers),
        storage_path=storage_path,
        storage_shared=None,
        plans=batch_plans(cfg),
        data=data,
        model_parameters=n_params,
        spare_workers=cfg.failure.spare_workers if features.requested("warm_spares") and
        features.unavailable_reason("warm_spares") is None else 0,
        spares_after_s=cfg.failure.spares_after_s,
        versions=versions_line(),
        internals=features.summary_line(),
    )


def check_stream_cpus_first(cfg: JobConfig) -> None:
    """``data.ray_mode=stream``: the free-CPU check of :func:`check_cluster`, run right after ``ray.init`` and
    before the data is built, whose counting pass reads the whole data set (35 s on the heavy bench) first.
    (``auto`` picks streaming from the data's size, known only while building: checked after it.)"""
    if cfg.data.name == "ray" and cfg.data.ray_mode == "stream":
        _check_stream_cpus(cfg, _cluster_report(cfg, "", {"mode": "stream"}, 0))


def _check_stream_cpus(cfg: JobConfig, report: PreflightReport) -> None:
    """A streamed data set is read by Ray Data tasks while the workers train: they need a CPU the workers leave."""
    if report.data.get("mode") != "stream":
        return
    workers = min(report.requested[1], max(report.fit_workers, report.requested[0]))
    spare = report.total_cpus - workers * report.resources_per_worker.get("CPU", 0.0)
    if spare >= 1.0:
        return
    reason = (f"{workers} worker(s) x {report.resources_per_worker} leave {spare:g} of {report.total_cpus:g} CPUs; "
              "a streamed data set (data.ray_mode=stream) needs at least 1 free CPU for Ray Data's read tasks")
    if cfg.scaling.autoscaling:
        report.warnings.append(reason)
        return
    raise ConfigError("scaling.num_workers", cfg.scaling.num_workers, reason)


def _check_fit(cfg: JobConfig, report: PreflightReport) -> None:
    lo, hi = report.requested
    fit, res = report.fit_workers, report.resources_per_worker
    have = {k: sum(float(n.gpus if k == "GPU" else n.cpus if k == "CPU" else 0) for n in report.nodes) for k in res}
    if fit < lo:
        reason = (
            f"needs {lo} worker(s) x {res}, the cluster has {have} in all: at most {fit} worker(s) fit"
        )
        if not cfg.scaling.autoscaling:
            field_name = (
                "scaling.resources_per_worker"
                if fit == 0 and cfg.scaling.resources_per_worker
                else "scaling.num_workers"
            )
            value = cfg.scaling.resources_per_worker if field_name.endswith("worker") else cfg.scaling.num_workers
            raise ConfigError(field_name, value, reason)
        report.warnings.append(reason + "; waiting for the autoscaler")
    elif fit < hi:
        report.warnings.append(f"{fit} of up to {hi} workers fit now; the run grows when capacity appears")


def _probe_torch_gpus(report: PreflightReport) -> None:
    """Ask torch on every GPU node how many devices it sees (Ray's GPU count is only a label)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    refs = {}
    for n in report.nodes:
        if n.gpus > 0:
            strategy = NodeAffinitySchedulingStrategy(n.node_id, soft=False)
            refs[n.node_id] = _torch_device_count.options(scheduling_strategy=strategy).remote()
    for n in report.nodes:
        if n.node_id in refs:
            try:
                n.torch_gpus = ray.get(refs[n.node_id], timeout=120)
            except Exception as e:  # a probe failure is a warning, not a verdict
                report.warnings.append(f"could not probe GPUs on {n.address}: {type(e).__name__}")
                continue
            if n.torch_gpus < n.gpus:
                report.warnings.append(f"node {n.address}: Ray advertises {n.gpus:g} GPUs, torch sees {n.torch_gpus}")


@ray.remote(num_cpus=0)
def _torch_device_count() -> int:
    env = {k: v for k, v in __import__("os").environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    out = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True, text=True, env=env, timeout=100, check=False,
    )
    return int(out.stdout.strip() or 0)


def check_storage(path: str, nodes: list[NodeInfo]) -> bool | None:
    """Writable from the driver, and (local paths on several nodes) visible from every node."""
    marker_name = f".preflight-{uuid.uuid4().hex[:12]}"
    if "://" in path:
        _check_uri_storage(path, marker_name)
        return True
    root = Path(path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        marker = root / marker_name
        marker.write_text("elastic-train preflight")
    except OSError as e:
        raise ConfigError("checkpoint.storage_path", path, f"not writable ({e.strerror or e})") from None
    try:
        if len(nodes) <= 1:
            return None
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        refs = [
            _path_exists.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)
            ).remote(str(marker))
            for n in nodes
        ]
        seen = ray.get(refs, timeout=120)
        blind = [n.address for n, ok in zip(nodes, seen, strict=True) if not ok]
        if blind:
            raise ConfigError(
                "checkpoint.storage_path", path,
                f"is local to the driver's node; node(s) {', '.join(blind)} cannot see it. "
                "Use a shared filesystem (NFS) or s3:// / gs:// storage for multi-node runs",
            )
        return True
    finally:
        marker.unlink(missing_ok=True)


@ray.remote(num_cpus=0)
def _path_exists(path: str) -> bool:
    return Path(path).exists()


def _check_uri_storage(uri: str, marker_name: str) -> None:
    check_uri_storage(uri, marker_name=marker_name)


def check_uri_storage(uri: str, field: str = "checkpoint.storage_path", marker_name: str | None = None) -> None:
    """An object-store path is usable: the endpoint answers, the credentials are accepted, the bucket exists and
    a marker can be written and deleted. Bounded (elastic_train.data.filesystems); ConfigError naming ``field``."""
    marker_name = marker_name or f".preflight-{uuid.uuid4().hex[:12]}"
    try:
        fs, base = filesystems.resolve(uri)
        problem = filesystems.check_bucket(fs, base, uri)
        if problem is None:
            fs.create_dir(base, recursive=True)
            marker = f"{base.rstrip('/')}/{marker_name}"
            with fs.open_output_stream(marker) as f:
                f.write(b"elastic-train preflight")
            fs.delete_file(marker)
    except Exception as e:  # any storage failure is a config problem
        raise ConfigError(field, uri, f"not usable: {filesystems.explain(e)}") from None
    if problem is not None:
        raise ConfigError(field, uri, f"not usable: {problem}")
