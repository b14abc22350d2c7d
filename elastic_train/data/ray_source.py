"""``data.name=ray``: files read with Ray Data (local, NFS or ``s3://``), optionally preprocessed with
``map_batches`` on Ray's CPU slots, then handed to the engine in a deterministic order.

The only module in ``data/`` that imports Ray (``ray.data``, inside functions; the import-linter contract in
pyproject.toml names this one exception). Two stages, both on the driver before any training worker starts:

* :func:`validate` needs no Ray: the path lists files of ``data.format`` (through
  :mod:`~elastic_train.data.filesystems`, bounded), the preprocess function resolves, and for Parquet the
  feature, label and id columns exist in the file schema. Every mistake is a ConfigError naming the field.
  Instead of files, ``data.dataset`` names a user's function that returns a ``ray.data.Dataset``: it must
  resolve here, and return a Dataset when called (``data.dataset`` is named otherwise).
* :func:`build_ray` reads with Ray Data (the file list sorted, ``preserve_order``), runs the preprocess as
  ``map_batches`` with ``data.preprocess_cpus`` per task, checks the columns again on the result, materialises
  the columns the model needs and sorts the rows by ``data.id_column`` (else by file and row order).

That is ``data.ray_mode=materialize``. ``data.ray_mode=stream`` (:func:`build_stream`, :class:`StreamSource`)
keeps no rows in memory: the driver counts, the workers stream each epoch through ``streaming_split`` and
:mod:`elastic_train.data.stream` makes it exactly once per epoch across restarts (not bitwise). ``auto`` picks
by the decoded size against the object store (:func:`data_bytes`).

What materialising gives (DESIGN invariant 8): the engine receives an in-memory :class:`TensorSet` whose row order does
not depend on how Ray Data scheduled the read, so the sampler's order is a pure function of (seed, epoch) and a
restart or resize is exactly-once per epoch and, at the same world size, bitwise. What it does not give: the
data is materialised on the driver and shared through the object store, so it must fit in memory (see
docs/ray-data.md).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow.fs
import torch

from elastic_train.compat.ray_data import export_parquet_footer_readers
from elastic_train.data import filesystems
from elastic_train.data.ids import val_mask
from elastic_train.data.spec import DataBundle, DataSpec, SourceInfo, StreamSplit, TensorSet, split_indices
from elastic_train.data.stream import batch_tensors, check_stream_batches, choose_mode
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
    """What :func:`validate` found: the filesystem, the sorted files and their total size; or, for
    ``data.dataset``, the user's function (``function``, called with ``options``) and no files."""

    fs: pyarrow.fs.FileSystem | None
    files: list[str]
    total_bytes: int
    listing_digest: str
    function: str | None = None
    options: dict[str, Any] | None = None


def validate(job: JobConfig) -> RayFiles:
    """Check a ``data.name=ray`` config without Ray; ConfigError naming the field on any mistake."""
    cfg = job.data
    if not cfg.path and not cfg.dataset:
        raise ConfigError("data.path", cfg.path, "data.name=ray needs a file or folder (local or s3://), or "
                          "data.dataset")
    if not cfg.features:
        raise ConfigError("data.features", cfg.features, "data.name=ray needs at least one feature column")
    if cfg.preprocess:
        resolve_import(cfg.preprocess, "data.preprocess")
    if cfg.dataset:
        if cfg.path:
            raise ConfigError("data.dataset", cfg.dataset, f"give data.dataset or data.path ({cfg.path!r}), not both")
        if not callable(resolve_import(cfg.dataset, "data.dataset")):
            raise ConfigError("data.dataset", cfg.dataset, "not a function")
        digest = hashlib.sha256(f"{cfg.dataset}\0{sorted(cfg.options.items())}".encode()).hexdigest()[:16]
        return RayFiles(None, [], 0, digest, cfg.dataset, dict(cfg.options))
    found = list_files(cfg.path, cfg.format)
    if cfg.format == "parquet" and not cfg.preprocess:
        import pyarrow.parquet as pq

        try:
            names = set(pq.read_schema(found.files[0], filesystem=found.fs).names)
        except Exception as e:  # an unreadable first file is the path's problem
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
    except Exception as e:  # a preprocess that raises, or an unreadable file
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


FOOTERS_READ = 16  # Parquet: the uncompressed size is estimated from this many files' footers


def data_bytes(fmt: str, found: RayFiles) -> int:
    """The data set's size in memory, estimated: for Parquet from up to ``FOOTERS_READ`` files' footers (rows x
    width for fixed-width columns, which dictionary encoding can shrink a thousandfold on disk; the uncompressed
    size for the others), scaled to all files by file size; else the files' size."""
    if fmt != "parquet":
        return found.total_bytes
    import pyarrow.parquet as pq

    sample = found.files[:: max(1, len(found.files) // FOOTERS_READ)][:FOOTERS_READ]
    try:
        raw = on_disk = 0
        for path in sample:
            meta = pq.read_metadata(path, filesystem=found.fs)
            raw += _decoded_bytes(meta)
            on_disk += found.fs.get_file_info(path).size or 0
    except Exception:  # an estimate only: the file size stands in
        return found.total_bytes
    return int(found.total_bytes * raw / on_disk) if on_disk else found.total_bytes


def _fixed_width(t: Any) -> int | None:
    import pyarrow as pa

    if pa.types.is_fixed_size_list(t):
        inner = _fixed_width(t.value_type)
        return None if inner is None else inner * t.list_size
    try:
        return t.bit_width // 8 if t.bit_width >= 8 else None
    except ValueError:  # variable width: strings, lists
        return None


def _decoded_bytes(meta: Any) -> int:
    """One Parquet file's size decoded: rows x width for fixed-width columns, else their uncompressed size."""
    schema = meta.schema.to_arrow_schema()
    widths = {f.name: _fixed_width(f.type) for f in schema}
    total = 0
    total += sum(width * meta.num_rows for width in widths.values() if width is not None)
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if widths.get(col.path_in_schema.split(".")[0]) is None:
                total += col.total_uncompressed_size
    return total


def object_store_bytes() -> float | None:
    """The connected cluster's object store size (None when Ray is not connected)."""
    import ray

    if not ray.is_initialized():
        return None
    return ray.cluster_resources().get("object_store_memory")


def build_ray(job: JobConfig) -> DataBundle:
    """``data.ray_mode``: materialise (below) or stream (:func:`build_stream`); auto picks by size."""
    cfg = job.data
    found = validate(job)
    size = data_bytes(cfg.format, found) if found.function is None else 0
    mode, why = choose_mode(cfg.ray_mode, cfg.id_column, size, object_store_bytes())
    if found.function is not None and cfg.ray_mode == "auto":
        mode, why = "materialize", "auto: a data.dataset's size is unknown; data.ray_mode=stream streams it"
    if mode == "stream":
        if job.scaling.strategy == "fsdp":
            raise ConfigError("data.ray_mode", cfg.ray_mode, "streaming is not supported with scaling.strategy=fsdp "
                              "(its evaluation needs equal batch counts per rank); use data.ray_mode=materialize")
        check_stream_batches(job.train.global_batch_size, job.scaling.min_workers, job.scaling.max_workers)
        bundle = build_stream(job, found, why)
        bundle.info["data_bytes"] = size
        return bundle
    bundle = build_materialized(job, found)
    bundle.info.update({"mode": "materialize", "mode_reason": why, "data_bytes": size})
    return bundle


def build_materialized(job: JobConfig, found: RayFiles) -> DataBundle:
    """Read, preprocess and materialise the data set in a deterministic row order (see the module docstring)."""
    cfg = job.data
    ds = _read(cfg.format, found)
    if cfg.preprocess:
        ds = _preprocessed(ds, cfg.preprocess, cfg.preprocess_cpus, cfg.preprocess_concurrency,
                           cfg.preprocess_block_rows)
    columns = [*cfg.features, cfg.label, *([cfg.id_column] if cfg.id_column else [])]
    try:
        with _quiet_ray_data():
            ds = ds.materialize()  # read (and preprocess) once; the schema and the rows come from these blocks
        schema = ds.schema()
    except Exception as e:  # a preprocess that raises, or an unreadable file
        raise _reading_failed(cfg, e) from None
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
        name=_source_name(cfg), uri=cfg.path or cfg.dataset or "", digest=digest.hexdigest()[:16],
        schema={c: types.get(c, "?") for c in columns}, num_rows=len(x),
        profile={"files": len(found.files), "bytes": found.total_bytes, "listing_digest": found.listing_digest,
                 "preprocess": cfg.preprocess or ""},
    )
    info = {"source": cfg.path or cfg.dataset, "format": _format(cfg), "files": len(found.files),
            "bytes": found.total_bytes}
    return DataBundle(TensorSet(x[tr], y[tr]), TensorSet(x[va], y[va]), spec, info, source)


def _read(fmt: str, found: RayFiles, preserve_order: bool = True, file_seed: int | None = None) -> Any:
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = preserve_order  # materialise: the same rows in the same order
    ctx.enable_progress_bars = False  # quiet when healthy (DESIGN invariant 10)
    ctx.print_on_execution_start = False
    if found.function:
        return _user_dataset(found.function, found.options or {})
    kwargs: dict[str, Any] = {"filesystem": found.fs}
    readers = {
        "parquet": ray.data.read_parquet, "csv": ray.data.read_csv, "json": ray.data.read_json,
        "numpy": ray.data.read_numpy, "images": ray.data.read_images,
    }
    if fmt == "images":
        kwargs["include_paths"] = True
    if file_seed is not None:
        kwargs["shuffle"] = ray.data.FileShuffleConfig(seed=file_seed)
    if fmt == "parquet":  # a Parquet read: not 32 new processes per execution to list a few files
        export_parquet_footer_readers(len(found.files))
    return readers[fmt](found.files, **kwargs)


def _preprocessed(ds: Any, preprocess: str | None, cpus: float, concurrency: int | None, block_rows: int | None,
                  then: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None) -> Any:
    """``data.preprocess`` as ``map_batches`` on Ray's CPU slots, ``cpus`` each, at most ``concurrency`` tasks at
    once (as Ray Data's compute strategy: ``concurrency=`` is deprecated since Ray 2.51 and warns on every run;
    None: Ray decides), followed by ``then`` in the same task. The materialised and the streamed builds share it.

    Ray Data reads small files into few blocks (Ray 2.60 reads a few MB of Parquet files as one block, whatever
    ``override_num_blocks`` says), and one block is one map task: a CPU-heavy preprocess ran as one task on one
    CPU whatever the cluster had. ``block_rows`` first splits the read blocks (a streaming repartition fused into
    the read: no barrier), so the preprocess fans out over the cluster's CPUs. ``then`` (the stream's row
    filter) runs inside the preprocess's task rather than as an operator of its own, which would take a CPU slot
    per block from the preprocess and copy every block once more."""
    import ray.data

    fn = resolve_import(preprocess, "data.preprocess") if preprocess else None
    if fn is None:
        return ds if then is None else ds.map_batches(then, batch_format="numpy", zero_copy_batch=True)
    if block_rows:
        ds = ds.repartition(target_num_rows_per_block=block_rows)
    if then is not None:
        user = fn

        def fn(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return then(user(batch))

        fn.__name__ = getattr(user, "__name__", "preprocess")  # Ray Data names the operator after it
    compute = ray.data.TaskPoolStrategy(size=concurrency) if concurrency else None
    return ds.map_batches(fn, batch_format="numpy", num_cpus=cpus, compute=compute)


def _user_dataset(function: str, options: dict[str, Any]) -> Any:
    """``data.dataset`` called; ConfigError naming it when it raises or returns something else."""
    import ray.data

    try:
        ds = resolve_import(function, "data.dataset")(**options)
    except ConfigError:
        raise
    except Exception as e:  # a preprocess that raises, or an unreadable file
        raise ConfigError("data.dataset", function, f"raised {_first_line(e)}") from None
    if not isinstance(ds, ray.data.Dataset):
        raise ConfigError("data.dataset", function, f"returned {type(ds).__name__}, not a ray.data.Dataset")
    return ds


@contextmanager
def _quiet_ray_data() -> Iterator[None]:
    """Ray Data logs every execution plan at INFO (and that progress bars are off, at WARNING) on the driver; a
    healthy run prints our lines only. Its console handler goes quiet for the block; its ray-data.log keeps
    everything. ``import ray.data`` (re)configures the "ray.data" logger, so it comes first."""
    import ray.data  # noqa: F401

    consoles = [h for h in logging.getLogger("ray.data").handlers if isinstance(h, logging.StreamHandler)]
    levels = [h.level for h in consoles]
    for h in consoles:
        h.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for h, level in zip(consoles, levels, strict=True):
            h.setLevel(level)


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


def _source_name(cfg: Any) -> str:
    return "ray:dataset" if cfg.dataset else f"ray:{cfg.format}"


def _format(cfg: Any) -> str:
    return "ray.data.Dataset" if cfg.dataset else cfg.format


def _reading_failed(cfg: Any, e: BaseException) -> ConfigError:
    if isinstance(e, ConfigError):
        return e
    field_name, value = ("data.preprocess", cfg.preprocess) if cfg.preprocess else \
        ("data.dataset", cfg.dataset) if cfg.dataset else ("data.path", cfg.path)
    return ConfigError(field_name, value, f"reading failed: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"


# ---------------------------------------------------------------------------------------- stream mode


@dataclass
class StreamSource:
    """Everything a worker needs to read its share of a streamed split (picklable: it travels in the bundle).

    Per epoch, rank 0 builds ``read (files in an order drawn from (seed, epoch)) -> [split blocks, preprocess] ->
    keep this part's rows (and drop the ids already consumed) -> streaming_split(world)`` and broadcasts the split's
    iterators (:class:`~elastic_train.data.stream.StreamData`); every rank reads its own with ``iter_batches``.
    """

    fmt: str
    found: RayFiles
    features: list[str]
    label: str
    id_column: str
    feature_shape: list[int] | None
    preprocess: str | None
    preprocess_cpus: float
    preprocess_concurrency: int | None
    val_fraction: float
    seed: int
    prefetch_batches: int = 1
    shuffle_buffer: int | None = None
    preprocess_block_rows: int | None = None

    @classmethod
    def of(cls, job: JobConfig, found: RayFiles) -> StreamSource:
        c = job.data
        assert c.id_column is not None
        return cls(c.format, found, list(c.features), c.label, c.id_column, c.feature_shape, c.preprocess,
                   c.preprocess_cpus, c.preprocess_concurrency, c.val_fraction, job.seed, c.ray_prefetch_batches,
                   c.ray_shuffle_buffer, c.preprocess_block_rows)

    @property
    def columns(self) -> list[str]:
        return [*self.features, self.label, self.id_column]

    def base(self, file_seed: int | None = None, then: Any = None) -> Any:
        """read -> optional preprocess (map_batches on Ray's CPU slots) -> ``then``; no order kept: it is streamed.
        ``file_seed``: the files are read in an order drawn from it (Ray Data's file shuffle)."""
        log = logging.getLogger("ray.data")
        if log.getEffectiveLevel() < logging.WARNING:  # Ray Data's plan lines, in every worker
            log.setLevel(logging.WARNING)
        ds = _read(self.fmt, self.found, preserve_order=False, file_seed=file_seed)
        return _preprocessed(ds, self.preprocess, self.preprocess_cpus, self.preprocess_concurrency,
                             self.preprocess_block_rows, then)

    def part(self, part: str, exclude: np.ndarray | None = None, file_seed: int | None = None) -> Any:
        """The rows of ``part`` ("train" or "val", by a seeded hash of the id), less the ids in ``exclude``."""
        columns, id_column, fraction, seed, want_val = self.columns, self.id_column, self.val_fraction, self.seed, \
            part == "val"
        excluded = None if exclude is None or len(exclude) == 0 else np.sort(np.asarray(exclude))

        def pick(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            ids = batch[id_column]
            keep = val_mask(ids, fraction, seed) == want_val
            if excluded is not None:
                keep &= ~np.isin(ids, excluded, assume_unique=False)
            return {c: batch[c][keep] for c in columns}

        return self.base(file_seed, then=pick)

    def split(self, part: str, epoch: int, seed: int, world: int, exclude: np.ndarray | None,
              equal: bool) -> list[Any]:
        """The epoch's ``world`` iterators. The training files are read in an order drawn from (seed, epoch); no
        ``randomize_block_order``: it is an all-to-all barrier that holds the whole epoch in the object store
        before the first batch (measured: first batch after the last block's preprocess)."""
        file_seed = (seed * 1_000_003 + epoch) % 2**31 if part == "train" else None
        return self.part(part, exclude, file_seed).streaming_split(world, equal=equal)

    def batches(self, it: Any, batch_size: int, prefetch: int, shuffle_buffer: int | None,
                shuffle_seed: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        for batch in it.iter_batches(batch_size=batch_size, batch_format="numpy", prefetch_batches=prefetch,
                                     local_shuffle_buffer_size=shuffle_buffer,
                                     local_shuffle_seed=shuffle_seed if shuffle_buffer else None, drop_last=False):
            x, y = self.tensors(batch)
            yield x, y, np.asarray(batch[self.id_column])

    def tensors(self, batch: dict[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        return batch_tensors(batch, self.features, self.label, self.feature_shape)


def build_stream(job: JobConfig, found: RayFiles, why: str) -> DataBundle:
    """A streamed bundle: no rows in memory. The driver reads a few rows (columns, shapes) and makes one counting
    pass over the id and label columns (train/val sizes, classes); workers stream the rest."""
    cfg = job.data
    src = StreamSource.of(job, found)
    try:
        with _quiet_ray_data():
            base = src.base()
            head = base.limit(4).take_batch(4, batch_format="numpy")
            check_columns(job, set(head))
            n_train = n_val = 0
            top = 0
            for batch in base.select_columns([src.id_column, src.label]).iter_batches(
                    batch_format="numpy", batch_size=65536):
                held = val_mask(batch[src.id_column], cfg.val_fraction, job.seed)
                n_val += int(held.sum())
                n_train += int((~held).sum())
                if len(held):
                    top = max(top, int(np.asarray(batch[src.label]).max()))
    except ConfigError:
        raise
    except Exception as e:  # a preprocess that raises, or an unreadable file
        raise _reading_failed(cfg, e) from None
    try:
        x, _ = src.tensors(head)
    except ValueError as e:
        raise ConfigError("data.feature_shape", cfg.feature_shape, f"does not hold the features: {e}") from None
    spec = DataSpec("classification", tuple(x.shape[1:]), max(top + 1, 2))
    columns = src.columns
    source = SourceInfo(
        name=_source_name(cfg), uri=cfg.path or cfg.dataset or "", digest=found.listing_digest,
        schema={c: str(np.asarray(head[c]).dtype) for c in columns}, num_rows=n_train + n_val,
        profile={"files": len(found.files), "bytes": found.total_bytes, "listing_digest": found.listing_digest,
                 "preprocess": cfg.preprocess or "", "mode": "stream"},
    )
    info = {"source": cfg.path or cfg.dataset, "format": _format(cfg), "files": len(found.files),
            "bytes": found.total_bytes,
            "mode": "stream", "mode_reason": why}
    example = x[:2].numpy()
    return DataBundle(StreamSplit(src, n_train, example, "train"), StreamSplit(src, n_val, example, "val"),
                      spec, info, source)
