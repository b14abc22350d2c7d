"""Both kinds of a worker's data satisfy the one StepSource protocol the session is written against."""

from __future__ import annotations

import inspect

from elastic_train.data.loader import StepSource, WorkerData
from elastic_train.data.stream import StreamData


def test_worker_data_and_stream_data_share_one_interface():
    for cls in (WorkerData, StreamData):
        for name, member in vars(StepSource).items():
            if name.startswith("_") or name == "trace":
                continue
            assert hasattr(cls, name), f"{cls.__name__} lacks StepSource.{name}"
            theirs = inspect.getattr_static(cls, name)  # a property stays a property, a method a function
            assert type(theirs) is type(member), (cls, name, type(theirs), type(member))
            if callable(member):
                assert list(inspect.signature(theirs).parameters) == list(inspect.signature(member).parameters), (
                    cls, name)
