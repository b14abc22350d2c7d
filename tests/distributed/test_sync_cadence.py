"""Sync cadence is a setting of its own (train.sync_every_steps), not a side effect of logging: with train metrics
logged only at the epoch's end, a clock-based checkpoint still comes at the next sync point. Real 2-worker gloo."""

from __future__ import annotations

import re

import pytest

from tests.helpers.worker_logs import WorkerLogs

pytestmark = pytest.mark.distributed


def test_clock_checkpoints_come_at_sync_points_when_logging_is_rare(job, ray_session):
    logs = WorkerLogs(ray_session)
    summary = job("sync-cadence", "train.epochs=1", "tracking.log_every_steps=1000", "train.sync_every_steps=3",
                  "checkpoint.every_seconds=0.001")
    assert summary["status"] == "FINISHED"
    steps = [int(s) for s in re.findall(r"epoch [\d.]+/1 step (\d+): .*\[checkpoint: every 0\.001 s\]", logs.since())]
    # Before this setting the only sync point of such a run was its epoch end: no clock checkpoint at all.
    assert steps and all(s % 3 == 0 for s in steps), steps
