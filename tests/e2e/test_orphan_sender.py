"""A dead worker's metrics sender and the restarted run's sender, against a real ``mlflow server``: each step once.

Rank 0's sender child (tracking/sender.py) outlives its worker on purpose, and keeps the steps it holds while
MLflow is away. The fault campaign's seed 22 found the consequence: the restarted run asked the server for its
last step before that orphan delivered, and logged those steps again (step 10 twice). A restarted sender that
trusted its own record instead skipped steps the dead process never delivered (a step missing). Both cases
here, without the campaign: the server is away from the start (its store is prepared first), the orphan is the
real sender process reading end-of-file, and the server starts only once both restarted senders hold their
recomputed steps. No sleeps: the test waits on the orphan's lock and on the processes' own answers.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from tests.cluster.test_elastic import wait_for
from tests.helpers.mlflow_server import MlflowServer

pytestmark = [pytest.mark.e2e, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]


def _held(path: Path) -> bool:
    """Whether another process holds ``path``'s flock (probed without keeping it)."""
    if not path.exists():
        return False
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def _orphan(spec, steps: range) -> tuple[subprocess.Popen, list[dict]]:
    """The dead worker's sender: the real child, handed ``steps`` (unless_logged, as rank 0 logs them), then
    end-of-file: what it reads when its training process dies. Returns it and its answers (read by a thread)."""
    proc = subprocess.Popen([sys.executable, "-m", "tracking.sender", json.dumps(asdict(spec))], cwd=ROOT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    for s in steps:
        proc.stdin.write(json.dumps(["log_metrics", [{"train_loss": float(s)}, s, int(time.time() * 1000), True]])
                         + "\n")
    proc.stdin.close()
    answers: list[dict] = []
    threading.Thread(target=lambda: answers.extend(json.loads(line) for line in proc.stdout), daemon=True).start()
    return proc, answers


def test_an_orphaned_sender_is_fenced_so_every_step_reaches_mlflow_once(tmp_path):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    from tracking.base import TrackingSpec
    from tracking.fence import lock_path
    from tracking.sender import ProcessTracker

    server = MlflowServer(tmp_path / "mlflow")
    store = MlflowClient(tracking_uri=f"sqlite:///{server.home / 'mlflow.db'}")  # the server's store, before it
    exp = store.create_experiment("orphans", artifact_location=(tmp_path / "artifacts").as_uri())
    specs = {}
    for case in ("twice", "missing"):  # steps 1-5 reached MLflow before the outage; checkpoint at step 5
        run_id = store.create_run(exp).info.run_id
        store.log_batch(run_id, metrics=[Metric("train_loss", float(s), 0, s) for s in range(1, 6)])
        specs[case] = TrackingSpec(uri=server.uri, run_id=run_id, experiment_id=exp,
                                   spool_path=str(tmp_path / "results" / case / "mlflow_unsent.jsonl"))

    # "twice": the dead worker's sender holds steps 6-10 through the outage
    orphan, answers = _orphan(specs["twice"], range(6, 11))
    wait_for(lambda: _held(lock_path(specs["twice"].spool_path, specs["twice"].run_id)), 60, "the orphan's lock")
    restarted = {case: ProcessTracker(spec) for case, spec in specs.items()}
    try:
        # What a restarted rank 0 passes: the driver saw step 5 ("twice": the orphan has not delivered yet); the
        # worker's record says 10 ("missing": steps 6-10 were handed to a process that died with them).
        restarted["twice"].skip_logged_steps(fallback=5)
        restarted["missing"].skip_logged_steps(fallback=10)
        for tracker in restarted.values():
            for s in range(6, 13):  # recomputed from the step-5 checkpoint, then on
                tracker.log_metrics({"train_loss": float(s)}, step=s, unless_logged=True)
        server.start(timeout_s=180)
        closed = {case: tracker.close(timeout_s=150) for case, tracker in restarted.items()}
        orphan.wait(timeout=30)  # the process we started exits at once (its child carries on detached)
        wait_for(lambda: len(answers) >= 2, 60, "the orphan's close answer")
    finally:
        server.stop()
        pid = answers[0].get("pid") if answers else None
        if pid:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
    # The orphan sends steps 6-10 once the server answers, or (a machine so loaded that its 2-minute flush bound
    # passes first) spools them; the restarted sender skips exactly the ones it sent and logs the rest itself.
    orphan_sent = answers[-1]["sent"]
    assert orphan_sent + answers[-1]["unsent"] == 5, answers
    assert all(c["unsent"] == 0 for c in closed.values()), closed
    assert closed["twice"]["skipped"] == orphan_sent and closed["missing"]["skipped"] == 0, closed
    for case, spec in specs.items():  # read from the server's store
        steps = sorted(m.step for m in store.get_metric_history(spec.run_id, "train_loss"))
        assert steps == list(range(1, 13)), (case, steps)
