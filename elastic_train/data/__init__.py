"""Data sources, the data order and the per-worker batches.

    spec.py      DataSpec, TensorSet, DataBundle: what every source hands the engine
    registry.py  built-in datasets by name, or a user's 'package.module:function'
    text.py      language-model token sets (synthetic_tokens, byte-level text)
    batching.py  BatchPlan: one global batch over W workers and micro-batches (invariant 2)
    sampler.py   the data order, a pure function of (seed, epoch) (invariant 3)
    loader.py    WorkerData: one worker's micro-batches on its device
    stream.py    StreamData: the same from a streamed source, exactly once per epoch by consumed ids

Only torch and numpy here (no Ray, no MLflow, no pydantic at run time).
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use (PEP 562), not with the package: Ray Data's tasks unpickle the stream's row filter, which
# imports elastic_train.data.ids (numpy only), and an eager import here made each of them import torch first.
_EXPORTS = {
    "BatchPlan": "batching", "BUILTIN": "registry", "build_data": "registry", "DataBundle": "spec",
    "DataSpec": "spec", "TensorSet": "spec", "as_numpy_example": "spec", "describe": "spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
