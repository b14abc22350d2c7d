"""The MLflow checkpoint callback starts its sender only on the Train controller, never in a worker.

Ray Train hands every worker the run config, callbacks included: a callback that started its thread when
unpickled made each worker import MLflow and run a sender thread beside training (issue 13, seen with py-spy).
"""

from __future__ import annotations

import pickle
import threading

import pytest

from tracking.base import TrackingSpec
from tracking.checkpoints import MlflowCheckpointCallback


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.is_alive()}


@pytest.mark.slow  # seconds of CPU: make test, not the one-minute make test-fast
def test_unpickling_starts_nothing_and_the_training_start_does(tmp_path):
    spec = TrackingSpec(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", run_id="0" * 32, experiment_id="0",
                        spool_path=str(tmp_path / "unsent.jsonl"))
    before = _threads()
    clone = pickle.loads(pickle.dumps(MlflowCheckpointCallback(spec, ["best", "last"], "val_loss", "min")))
    assert clone._thread is None  # as a worker sees it: no thread, no MLflow import
    assert "mlflow-checkpoints" not in _threads() - before

    clone.after_controller_start(None)  # before the workers start: not yet (their start-up keeps the CPU)
    assert clone._thread is None
    clone.after_worker_group_training_start(None)  # what the controller calls once they run the train function
    assert clone._thread is not None and clone._thread.is_alive()
    assert clone.flush(timeout_s=60)["unsent"] == 0
    assert not clone._thread.is_alive()


def test_nothing_to_copy_starts_no_thread_even_on_the_controller(tmp_path):
    spec = TrackingSpec(uri=f"sqlite:///{tmp_path / 'mlflow.db'}", run_id="0" * 32, experiment_id="0",
                        spool_path=str(tmp_path / "unsent.jsonl"))
    clone = pickle.loads(pickle.dumps(MlflowCheckpointCallback(spec, ["none"], "val_loss", "min")))
    clone.after_worker_group_training_start(None)
    assert clone._thread is None
