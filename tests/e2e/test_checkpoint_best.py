"""A resumed job's ``checkpoints/best`` is replaced only by a better checkpoint, also when the tracking server was
away as the copying callback started (issue 51 item 3: the earlier best's score, unreadable, was taken as none,
and the next checkpoint, however bad, became the best). A real ``mlflow server``, stopped and started again."""

from __future__ import annotations

import pytest

from tests.helpers.mlflow_server import MlflowServer
from tests.unit.test_checkpoint_callback import _checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.subprocess]


def test_an_unknown_earlier_best_is_not_taken_for_none(tmp_path):
    from mlflow.tracking import MlflowClient

    from tracking import open_backend
    from tracking.checkpoints import BEST_SCORE_TAG, BEST_TAG, CheckpointCopier

    server = MlflowServer(tmp_path / "server").start()
    try:
        spec, _ = open_backend("mlflow", server.uri, tmp_path).start_run(
            "best", "resumed", kind="train", spool_path=tmp_path / "run" / "mlflow_unsent.jsonl")
        client = MlflowClient(tracking_uri=server.uri)
        client.set_tag(spec.run_id, BEST_TAG, "checkpoint_000000004")  # the earlier driver's best: 0.1
        client.set_tag(spec.run_id, BEST_SCORE_TAG, "0.1")
        server.stop()  # away while this driver's callback starts
        worse, worse_still = _checkpoints(tmp_path / "storage", 2)
        copier = CheckpointCopier(spec, ["best"], "val_loss", "min")
        copier.offer(worse, {"val_loss": 0.5})
        server.start()
        copier.offer(worse_still, {"val_loss": 0.6})
        copier.finish(timeout_s=120)
        tags = client.get_run(spec.run_id).data.tags
        assert (tags[BEST_TAG], tags[BEST_SCORE_TAG]) == ("checkpoint_000000004", "0.1"), tags
        assert client.list_artifacts(spec.run_id, "checkpoints") == []  # nothing replaced the earlier best
    finally:
        server.stop()
