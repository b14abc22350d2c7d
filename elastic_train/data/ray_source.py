"""``data.name=ray``: files read with Ray Data (local, NFS or ``s3://``), optionally preprocessed with
``map_batches`` on Ray's CPU slots, then handed to the engine in a deterministic order.

The only module in ``data/`` that imports Ray (``ray.data``, inside functions; the import-linter contract in
pyproject.toml names this one exception). Two stages, both on the driver before any training worker starts:

* :func:`validate` needs no Ray: the path lists files of ``data.format`` (through
  :mod:`~elastic_train.data.filesystems`, bounded), the preprocess function resolves, and for Parquet the
  feature, label and id columns exist in the file schema. Every mistake is a ConfigError naming the field.
* :func:`build_ray` reads with Ray Data (the file list sorted, ``preserve_order``), runs the preprocess as
  ``map_batches`` with ``data.preprocess_cpus`` per task, checks the columns again on the result, materialises
  the columns the model needs and sorts the rows by ``data.id_column`` (else by file and row order).

What this gives (DESIGN invariant 8): the engine receives an in-memory :class:`TensorSet` whose row order does
not depend on how Ray Data scheduled the read, so the sampler's order is a pure function of (seed, epoch) and a
restart or resize is exactly-once per epoch and, at the same world size, bitwise. What it does not give: the
data is materialised on the driver and shared through the object store, so it must fit in memory; it is not
streamed through ``get_dataset_shard`` (see docs/ray-data.md).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.fs
import torch

from elastic_train.data import filesystems
from elastic_train.data.spec import DataBundle, DataSpec, SourceInfo, TensorSet, split_indices
from elastic_train.errors import ConfigError
from elastic_train.plugins import resolve_import

if TYPE_CHECKING:
    from elastic_train.config import JobConfig

EXTENSIONS = {
    "parquet": (".parquet", ".pq"),
    "csv": (".csv",),
    "json": (".json", ".jsonl"),
    "images": (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"),
    "numpy": (".npy",),
}


@dataclass(frozen=True)
class RayFiles:
    """What :func:`validate` found: the filesystem, the sorted files and their total size."""

    fs: pyarrow.fs.FileSystem
    files: list[str]
    total_bytes: int
    listing_digest: str


def validate(job: JobConfig) -> RayFiles:
    """Check a ``data.name=ray`` config without Ray; ConfigError naming the field on any mistake."""
    cfg = job.data
    if not cfg.path:
        raise ConfigError("data.path", cfg.path, "data.name=ray needs a file or folder (local or s3://)")
    if not cfg.features:
        raise ConfigError("data.features", cfg.features, "data.name=ray needs at least one feature column")
    if cfg.preprocess:
        resolve_import(cfg.preprocess, "data.preprocess")
    found = list_files(cfg.path, cfg.format)
    if cfg.format == "parquet" and not cfg.preprocess:
        import pyarrow.parquet as pq

        try:
            names = set(pq.read_schema(found.files[0], filesystem=found.fs).names)
        except Exception as e:  # noqa: BLE001 - an unreadable first file is the path's problem
            reason = f"cannot read {found.files[0]}: {filesystems.explain(e)}"
            raise ConfigError("data.path", cfg.path, reason) from None
        check_columns(job, names)
    return found


def list_files(path: str, fmt: str) -> RayFiles:
    """The files of format ``fmt`` at ``path`` (a file or a folder, recursively), sorted."""
    try:
        fs, base = filesystems.resolve(path)
        problem = filesystems.check_bucket(fs, base, path)
        info = fs.get_file_info(base)
        if info.type == pyarrow.fs.FileType.File:
            infos = [info]
        elif info.type == pyarrow.fs.FileType.Directory:
            infos = [i for i in fs.get_file_info(pyarrow.fs.FileSelector(base, recursive=True))
                     if i.type == pyarrow.fs.FileType.File]
        else:
            infos = []
    except Exception as e:  # noqa: BLE001 - endpoint, credentials, bucket
        raise ConfigError("data.path", path, f"cannot list: {filesystems.explain(e)}") from None
    if problem is not None:
        raise ConfigError("data.path", path, problem)
    infos = sorted((i for i in infos if i.path.lower().endswith(EXTENSIONS[fmt])), key=lambda i: i.path)
    if not infos:
        raise ConfigError("data.path", path, f"no {fmt} files ({', '.join(EXTENSIONS[fmt])}) there")
    h = hashlib.sha256(fmt.encode())
    for i in infos:
        h.update(f"{i.path}\0{i.size}\0{i.mtime_ns}\n".encode())
    return RayFiles(fs, [i.path for i in infos], sum(i.size or 0 for i in infos), h.hexdigest()[:16])


def check_columns(job: JobConfig, names: set[str]) -> None:
    cfg = job.data
    have = ", ".join(sorted(names))
    for col in cfg.features:
        if col not in names:
            raise ConfigError("data.features", cfg.features, f"no column {col!r} (columns: {have})")
    if cfg.label not in names:
        raise ConfigError("data.label", cfg.label, f"no such column (columns: {have})")
    if cfg.id_column is not None and cfg.id_column not in names:
        raise ConfigError("data.id_column", cfg.id_column, f"no such column (columns: {have})")


def build_ray(job: JobConfig) -> DataBundle:
    """Read, preprocess and materialise the data set in a deterministic row order (see the module docstring)."""
    cfg = job.data
    found = validate(job)
    ds = _read(cfg.format, found)
    if cfg.preprocess:
        fn = resolve_import(cfg.preprocess, "data.preprocess")
        ds = ds.map_batches(fn, batch_format="numpy", num_cpus=cfg.preprocess_cpus,
                            concurrency=cfg.preprocess_concurrency)
    columns = [*cfg.features, cfg.label, *([cfg.id_column] if cfg.id_column else [])]
    try:
        with _quiet_ray_data():
            ds = ds.materialize()  # read (and preprocess) once; the schema and the rows come from these blocks
        schema = ds.schema()
    except Exception as e:  # noqa: BLE001 - a preprocess that raises, or an unreadable file
        field_name = "data.preprocess" if cfg.preprocess else "data.path"
        raise ConfigError(field_name, cfg.preprocess or cfg.path, f"reading failed: {_first_line(e)}") from None
    check_columns(job, set(schema.names))
    with _quiet_ray_data():
        arrays = _collect(ds.select_columns(columns), columns)
    x, y, ids = _order(job, arrays)
    tr, va = split_indices(len(x), cfg.val_fraction, job.seed)
    spec = DataSpec("classification", tuple(x.shape[1:]), max(int(y.max()) + 1, 2))
    types = dict(zip(schema.names, (str(t) for t in schema.types), strict=False))
    digest = hashlib.sha256()
    for a in (x.numpy(), y.numpy(), ids if ids.dtype != object else ids.astype(str)):
        digest.update(np.ascontiguousarray(a).tobytes())
    source = SourceInfo(
        name=f"ray:{cfg.format}", uri=cfg.path or "", digest=digest.hexdigest()[:16],
        schema={c: types.get(c, "?") for c in columns}, num_rows=len(x),
        profile={"files": len(found.files), "bytes": found.total_bytes, "listing_digest": found.listing_digest,
                 "preprocess": cfg.preprocess or ""},
    )
    info = {"source": cfg.path, "format": cfg.format, "files": len(found.files), "bytes": found.total_bytes}
    return DataBundle(TensorSet(x[tr], y[tr]), TensorSet(x[va], y[va]), spec, info, source)


def _read(fmt: str, found: RayFiles) -> Any:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True  # the same rows in the same order, however tasks are scheduled
    ctx.enable_progress_bars = False  # quiet when healthy (DESIGN invariant 10)
    kwargs: dict[str, Any] = {"filesystem": found.fs}
    readers = {
        "parquet": ray.data.read_parquet, "csv": ray.data.read_csv, "json": ray.data.read_json,
        "numpy": ray.data.read_numpy, "images": ray.data.read_images,
    }
    if fmt == "images":
        kwargs["include_paths"] = True
    return readers[fmt](found.files, **kwargs)


@contextmanager
def _quiet_ray_data() -> Iterator[None]:
    """Ray Data logs every execution plan at INFO on the driver; a healthy run prints our lines only."""
    log = logging.getLogger("ray.data")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _collect(ds: Any, columns: list[str]) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        for c in columns:
            col = batch[c]
            if col.dtype == object:  # variable-size lists come as arrays of arrays
                col = np.stack([np.asarray(v) for v in col])
            parts[c].append(col)
    return {c: np.concatenate(v) for c, v in parts.items()}


def _order(job: JobConfig, arrays: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Features, labels and ids sorted by id: the engine's row order, independent of the read's scheduling."""
    cfg = job.data
    n = len(arrays[cfg.label])
    ids = arrays[cfg.id_column] if cfg.id_column else np.arange(n)
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    if cfg.id_column and n > 1 and bool((ids[1:] == ids[:-1]).any()):
        raise ConfigError("data.id_column", cfg.id_column, "ids are not unique")
    feats = [arrays[c][order].reshape(n, -1).astype(np.float32) for c in cfg.features]
    x = torch.from_numpy(np.concatenate(feats, axis=1) if len(feats) > 1 else feats[0])
    if cfg.feature_shape:
        if int(np.prod(cfg.feature_shape)) != x.shape[1]:
            raise ConfigError("data.feature_shape", cfg.feature_shape, f"does not hold {x.shape[1]} features")
        x = x.reshape(n, *cfg.feature_shape)
    y = torch.from_numpy(arrays[cfg.label][order].astype(np.int64))
    return x, y, ids


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"
