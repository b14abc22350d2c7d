"""Helpers for running the real job in-process against the session's Ray cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs import train
from tests.conftest import tiny


def run_job(tmp: Path, name: str, *overrides: str, expect: int = 0) -> dict:
    """``python -m jobs.train`` in-process with the shrunk digits preset; returns the summary JSON."""
    summary = tmp / f"{name}.json"
    argv = ["--config", "configs/digits.yaml", *tiny(f"name={name}", f"checkpoint.storage_path={tmp}", *overrides),
            "--summary-json", str(summary)]
    assert train.main(argv) == expect
    return json.loads(summary.read_text())


@pytest.fixture
def job(ray_session, home):
    return lambda name, *o, expect=0: run_job(home, name, *o, expect=expect)
