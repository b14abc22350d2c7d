"""The deliberately CPU-heavy preprocess of ``bench/ingest.py --heavy``, in a module of its own that imports
numpy only: Ray Data's preprocess tasks import it, and a module that imports torch cost each new task process
seconds of import on a 2-core box."""

from __future__ import annotations

import numpy as np


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
