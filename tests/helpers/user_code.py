"""User-style plug-ins ('module:function') for tests: a dataset, a model, and wrong ones."""

from __future__ import annotations

import torch
from torch import nn


def blobs(n: int = 300):
    """((x, y), (x, y)) tensors: three Gaussian blobs in 2-D."""
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, 2, generator=g) * 0.3 + torch.stack([y.float(), (y == 1).float()], 1)
    cut = int(n * 0.8)
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def counted_digits(count_path: str):
    """scikit-learn's digits as ((x, y), (x, y)) tensors; appends one line (the building pid) to ``count_path``
    on every call, so a test can count how often a run or a sweep built its data, and where."""
    import os

    from sklearn.datasets import load_digits

    with open(count_path, "a") as f:
        f.write(f"{os.getpid()}\n")
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    cut = int(len(x) * 0.8)
    return (x[:cut], y[:cut]), (x[cut:], y[cut:])


def gated_digits(after: str | None = None, shuffle_labels: bool = False, timeout_s: float = 300.0):
    """scikit-learn's digits as ((x, y), (x, y)) tensors. ``after``: a glob; the data is built only once a path
    matches it (a sweep test holds one trial back until another one checkpointed: a fixed order, not a race).
    ``shuffle_labels``: the training labels permuted, so the trial cannot learn (ASHA stops it)."""
    import glob
    import time

    from sklearn.datasets import load_digits

    deadline = time.monotonic() + timeout_s
    while after and not glob.glob(after):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing matched {after} in {timeout_s} s")
        time.sleep(0.2)
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    cut = int(len(x) * 0.8)
    train_y = y[:cut][torch.randperm(cut, generator=torch.Generator().manual_seed(1))] if shuffle_labels else y[:cut]
    return (x[:cut], train_y), (x[cut:], y[cut:])


def not_a_dataset():
    return 42


def tiny_model(spec, width: int = 8) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(int(torch.tensor(spec.input_shape).prod()), width), nn.ReLU(),
                         nn.Linear(width, spec.num_classes))


def not_a_model(spec):
    return "model"
