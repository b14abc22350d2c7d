"""Which sample ids are held out for validation: a seeded hash of each id, in a module that imports numpy only.

Ray Data's tasks unpickle the streamed split's row filter, and with it whatever module its functions live in: a
filter reaching this through ``data/stream.py`` made every new Ray Data worker process import torch first (a
second or more per process on a 2-core box, measured as the preprocess tasks' start-up).
"""

from __future__ import annotations

import hashlib

import numpy as np


def val_mask(ids: np.ndarray, val_fraction: float, seed: int) -> np.ndarray:
    """True for the ids held out for validation: a seeded hash of each id, so the split needs no count and no
    order (a streamed data set cannot be permuted as a whole)."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        with np.errstate(over="ignore"):  # splitmix64: wrap-around arithmetic is the point
            z = ids.astype(np.uint64) + np.uint64((0x9E3779B97F4A7C15 * (seed + 1)) % 2**64)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        u = (z >> np.uint64(11)).astype(np.float64) / float(2**53)
    else:
        u = np.array([int.from_bytes(hashlib.blake2b(f"{seed}\0{i}".encode(), digest_size=8).digest(), "little")
                      / 2**64 for i in ids.tolist()], dtype=np.float64)
    return u < val_fraction
