"""Digits as Parquet files (for data.name=ray), and preprocess functions in the user's 'module:function' form."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from elastic_train.data import filesystems


def digits_table(seed: int = 0) -> pa.Table:
    """scikit-learn's 8x8 digits as rows ``id, pixels (64 floats, 0..16), label``, in a shuffled id order."""
    from sklearn.datasets import load_digits

    d = load_digits()
    order = np.random.default_rng(seed).permutation(len(d.target))  # files do not arrive sorted by id
    pixels = d.data.astype(np.float32)[order]
    return pa.table({
        "id": pa.array(order.astype(np.int64)),
        "pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), 64),
        "label": pa.array(d.target[order].astype(np.int64)),
    })


def digits_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`digits_table` as numpy: ids, pixels (n x 64 floats, 0..16), labels."""
    table = digits_table()
    return (table["id"].to_numpy(), np.asarray(table["pixels"].combine_chunks().flatten()).reshape(-1, 64),
            table["label"].to_numpy())


def write_digits_parquet(dest: str, files: int = 3) -> int:
    """Write the digits table to ``dest`` (a local folder or s3://bucket/prefix) as ``files`` Parquet files."""
    fs, base = filesystems.resolve(dest)
    fs.create_dir(base, recursive=True)
    table = digits_table()
    n = table.num_rows
    for i in range(files):
        part = table.slice(i * n // files, (i + 1) * n // files - i * n // files)
        pq.write_table(part, f"{base}/part-{i:03d}.parquet", filesystem=fs)
    return n


def scale_pixels(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A preprocess: pixels 0..16 -> 0..1, as a new column ``x``."""
    batch["x"] = np.stack([np.asarray(p, dtype=np.float32) for p in batch["pixels"]]) / 16.0
    return batch


def write_wide_parquet(dest: str, rows: int, width: int, files: int) -> int:
    """``rows`` rows ``id, x (width float32s), label`` in ``files`` Parquet files: 4 * width bytes a row in
    memory, but a few kB on disk (x is the label, repeated: compressible, and learnable). Returns the bytes in
    memory."""
    fs, base = filesystems.resolve(dest)
    fs.create_dir(base, recursive=True)
    for i in range(files):
        ids = np.arange(i * rows // files, (i + 1) * rows // files, dtype=np.int64)
        labels = ids % 2
        x = np.repeat(labels.astype(np.float32), width)
        pq.write_table(pa.table({
            "id": pa.array(ids),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(x), width),
            "label": pa.array(labels),
        }), f"{base}/part-{i:03d}.parquet", filesystem=fs, row_group_size=250)
    return rows * width * 4


def write_digits_jsonl(dest: str, files: int = 2) -> int:
    """The digits table as JSON lines (``id``, ``pixels`` a list of 64 numbers, ``label``) in ``files`` files."""
    import json

    fs, base = filesystems.resolve(dest)
    fs.create_dir(base, recursive=True)
    rows = digits_table().to_pylist()
    for i in range(files):
        part = rows[i * len(rows) // files:(i + 1) * len(rows) // files]
        with fs.open_output_stream(f"{base}/part-{i:03d}.jsonl") as f:
            f.write("".join(json.dumps(r) + "\n" for r in part).encode())
    return len(rows)


def digits_dataset(scale: float = 1.0):  # a ray.data.Dataset
    """A user's data.dataset function: the digits table as a ray.data.Dataset, pixels times ``scale``
    (``data.options`` are its keyword arguments)."""
    import ray.data

    ids, pixels, labels = digits_arrays()
    pixels = pixels * scale
    return ray.data.from_items([{"id": int(i), "x": p.astype(np.float32), "label": int(y)}
                                for i, p, y in zip(ids, pixels, labels, strict=True)])


def not_a_dataset() -> list[int]:
    """A data.dataset function that returns something else."""
    return [1, 2, 3]


def write_digits_csv(dest: str, files: int = 2) -> int:
    """The digits table as CSV files: ``id``, ``p0`` .. ``p63`` (one column a pixel), ``label``."""
    import pyarrow.csv as pcsv

    fs, base = filesystems.resolve(dest)
    fs.create_dir(base, recursive=True)
    ids, pixels, labels = digits_arrays()
    flat = pa.table({"id": ids, **{f"p{j}": pa.array(pixels[:, j]) for j in range(64)}, "label": labels})
    n = flat.num_rows
    for i in range(files):
        with fs.open_output_stream(f"{base}/part-{i}.csv") as f:
            pcsv.write_csv(flat.slice(i * n // files, (i + 1) * n // files - i * n // files), f)
    return n


def write_digits_numpy(dest: str, files: int = 2) -> int:
    """The digits table as ``.npy`` files of float32 rows ``[id, label, 64 pixels]`` (Ray Data reads each row as
    one ``data`` value); :func:`split_numpy_rows` is the preprocess that names the columns."""
    import io

    fs, base = filesystems.resolve(dest)
    fs.create_dir(base, recursive=True)
    ids, pixels, labels = digits_arrays()
    rows = np.concatenate([ids[:, None], labels[:, None], pixels], axis=1).astype(np.float32)
    n = len(rows)
    for i in range(files):
        buf = io.BytesIO()
        np.save(buf, rows[i * n // files:(i + 1) * n // files])
        with fs.open_output_stream(f"{base}/part-{i}.npy") as f:
            f.write(buf.getvalue())
    return n


def split_numpy_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A preprocess for :func:`write_digits_numpy`: ``data`` rows -> ``id``, ``label``, ``x`` (pixels / 16)."""
    data = np.stack([np.asarray(r, dtype=np.float32) for r in batch["data"]])
    return {"id": data[:, 0].astype(np.int64), "label": data[:, 1].astype(np.int64), "x": data[:, 2:] / 16.0}


def write_digits_images(dest: str) -> int:
    """The digits as 8x8 grayscale PNGs in an image-folder layout, ``<label>/<id>.png`` (what torchvision's
    ImageFolder and most image sets use). Returns the count."""
    import io

    from PIL import Image

    fs, base = filesystems.resolve(dest)
    ids, pixels, labels = digits_arrays()
    for y in set(labels.tolist()):
        fs.create_dir(f"{base}/{y}", recursive=True)
    for i, img, y in zip(ids, pixels.reshape(-1, 8, 8), labels, strict=True):
        buf = io.BytesIO()
        Image.fromarray((img * 255 / 16).round().astype(np.uint8), mode="L").save(buf, format="PNG")
        with fs.open_output_stream(f"{base}/{y}/{i}.png") as f:
            f.write(buf.getvalue())
    return len(ids)


def decode_digit_images(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A preprocess for :func:`write_digits_images`: decoded ``image`` -> ``x`` (0..1); the class and the id come
    from the path, ``<label>/<id>.png``."""
    import posixpath

    x = np.stack([np.asarray(im, dtype=np.float32).reshape(-1) for im in batch["image"]]) / 255.0
    parts = [posixpath.normpath(str(p)).split("/") for p in batch["path"]]
    return {"x": x, "label": np.array([int(p[-2]) for p in parts], np.int64),
            "id": np.array([int(p[-1].split(".")[0]) for p in parts], np.int64)}


def counting_pass_ran(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A preprocess that fails the first block it sees: a test that must be refused before the data is read."""
    raise RuntimeError("the counting pass ran")
