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

from elastic_train.data.batching import BatchPlan
from elastic_train.data.registry import BUILTIN, build_data
from elastic_train.data.spec import DataBundle, DataSpec, TensorSet, as_numpy_example, describe

__all__ = ["BUILTIN", "BatchPlan", "DataBundle", "DataSpec", "TensorSet", "as_numpy_example", "build_data", "describe"]
