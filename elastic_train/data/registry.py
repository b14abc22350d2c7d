"""The data registry: built-in datasets by name, or a user's ``'package.module:function'``.

Built-in datasets (``digits``, ``synthetic``) are in-memory :class:`TensorSet` s; the language-model sets live
in :mod:`elastic_train.data.text`. A user function returns a DataBundle, ``(train, val)`` torch Datasets or
``((x, y), (x, y))`` tensors and is called with ``data.options`` as keyword arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import Dataset

from elastic_train.data.spec import DataBundle, DataSpec, Split, TensorSet, split_indices
from elastic_train.errors import ConfigError
from elastic_train.plugins import resolve_import

if TYPE_CHECKING:  # pydantic-free at run time: bench/gpu.py imports this on a torch-only machine
    from elastic_train.config import JobConfig


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """``(images (N, 8, 8) float64, target (N,) int64)``: what ``sklearn.datasets.load_digits`` returns, read
    straight from the CSV scikit-learn ships. Importing ``sklearn.datasets`` (SciPy and friends) took ~1 s of the
    driver's start on 2 cores, where reading the file takes 5 ms; scikit-learn is only imported when its
    package holds no such file."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz") if spec and spec.origin \
        else ""
    if path and os.path.isfile(path):
        table = np.loadtxt(path, delimiter=",")
        return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.images, d.target


def build_digits(job: JobConfig) -> DataBundle:
    """scikit-learn's bundled 8x8 digits (1797 images, no download), scaled to [0, 1]."""
    cfg, seed = job.data, job.seed
    images, target = digits_arrays()
    x = torch.tensor(images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8)
    y = torch.tensor(target, dtype=torch.long)
    tr, va = split_indices(len(x), cfg.val_fraction, seed)
    spec = DataSpec("classification", (1, 8, 8), 10)
    return DataBundle(TensorSet(x[tr], y[tr]), TensorSet(x[va], y[va]), spec, {"source": "sklearn.load_digits"})


def build_synthetic(job: JobConfig) -> DataBundle:
    """Seeded, learnable classification: labels from a random two-layer teacher network."""
    cfg, seed = job.data, job.seed
    g = torch.Generator().manual_seed(10_007 + seed)
    n, f, c = cfg.num_samples, cfg.num_features, cfg.num_classes
    x = torch.randn(n, f, generator=g)
    w1 = torch.randn(f, 2 * f, generator=g) / f**0.5
    w2 = torch.randn(2 * f, c, generator=g) / (2 * f) ** 0.5
    y = torch.argmax(torch.tanh(x @ w1) @ w2, dim=1)
    tr, va = split_indices(n, cfg.val_fraction, seed)
    spec = DataSpec("classification", (f,), c)
    return DataBundle(TensorSet(x[tr], y[tr]), TensorSet(x[va], y[va]), spec, {"source": "synthetic teacher"})


def _language_model_data(name: str) -> Callable[[JobConfig], DataBundle]:
    def build(job: JobConfig) -> DataBundle:
        from elastic_train.data import text  # token datasets live in their own module; imported on use

        return getattr(text, f"build_{name}")(job)

    return build


def _ray_data(job: JobConfig) -> DataBundle:
    from elastic_train.data.ray_source import build_ray  # Ray Data: imported on use (and only here in data/)

    return build_ray(job)


def build_tokens(job: JobConfig) -> DataBundle:
    from elastic_train.data import tokens  # memory-mapped shards (jobs.prepare_tokens); imported on use

    return tokens.build_tokens(job)


# A builder gets the whole JobConfig: token datasets need model.seq_len, for one.
BUILTIN: dict[str, Callable[[JobConfig], DataBundle]] = {
    "digits": build_digits,
    "synthetic": build_synthetic,
    "synthetic_tokens": _language_model_data("synthetic_tokens"),
    "text": _language_model_data("text"),
    "ray": _ray_data,
    "tokens": build_tokens,
}

def _check_ray_data(job: JobConfig) -> None:
    from elastic_train.data.ray_source import validate  # files, columns, preprocess: no Ray needed

    validate(job)


# Sources read on the Ray cluster (Ray Data): their check that needs no cluster runs before Ray starts, their
# build after it. Every other source is built on the driver before Ray starts (a mistake exits 2 sooner).
READ_ON_CLUSTER: dict[str, Callable[[JobConfig], None]] = {"ray": _check_ray_data}


def precheck_on_cluster_source(cfg: JobConfig) -> bool:
    """Run the no-cluster checks of a source read on the cluster (ConfigError naming the field); True when the
    configured source is one, so the caller connects to Ray before :func:`build_data`."""
    check = READ_ON_CLUSTER.get(cfg.data.name)
    if check is None:
        return False
    check(cfg)
    return True


def build_data(cfg: JobConfig) -> DataBundle:
    """Build the configured dataset (on the driver to validate it, then on every worker)."""
    name = cfg.data.name
    if name in BUILTIN:
        bundle = BUILTIN[name](cfg)
    elif ":" in name:
        bundle = _user_data(resolve_import(name, "data.name"), cfg)
    else:
        known = ", ".join(sorted(BUILTIN))
        raise ConfigError("data.name", name, f"unknown dataset; built-ins: {known}, or 'package.module:function'")
    n_train = len(bundle.train)
    if cfg.train.global_batch_size > n_train:
        raise ConfigError(
            "train.global_batch_size",
            cfg.train.global_batch_size,
            f"larger than the training set ({n_train} samples of data.name={name!r})",
        )
    if len(bundle.val) == 0:
        raise ConfigError("data.val_fraction", cfg.data.val_fraction, "leaves an empty validation set")
    return bundle


def _user_data(fn: Callable[..., Any], cfg: JobConfig) -> DataBundle:
    """A user function returns a DataBundle, or ``(train, val)`` Datasets, or ``((x, y), (x, y))`` tensors."""
    try:
        out = fn(**cfg.data.options)
    except Exception as e:
        raise ConfigError("data.name", cfg.data.name, f"raised {type(e).__name__}: {e}") from None
    if isinstance(out, DataBundle):
        return out
    if isinstance(out, tuple | list) and len(out) == 2:
        train, val = (_assplit_indices(s) for s in out)
        if train is not None and val is not None and len(train) > 0:
            return DataBundle(train, val, _infer_spec(train), {"source": cfg.data.name})
    raise ConfigError(
        "data.name", cfg.data.name, "must return a DataBundle, (train, val) Datasets or ((x, y), (x, y)) tensors"
    )


def _assplit_indices(obj: Any) -> Split | None:
    if isinstance(obj, TensorSet | Dataset):
        return obj
    if isinstance(obj, tuple | list) and len(obj) == 2 and all(isinstance(t, torch.Tensor) for t in obj):
        return TensorSet(obj[0], obj[1])
    return None


def _infer_spec(train: Split) -> DataSpec:
    x, y = (train.x[0], train.y) if isinstance(train, TensorSet) else train[0]
    if isinstance(train, TensorSet):
        num_classes = int(y.max()) + 1
    else:
        num_classes = int(max(int(train[i][1]) for i in range(min(len(train), 1000)))) + 1
    return DataSpec("classification", tuple(torch.as_tensor(x).shape), max(num_classes, 2))
