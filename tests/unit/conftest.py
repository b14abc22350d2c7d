"""Fixtures of the unit tests."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import pytest

from tests.conftest import ROOT


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def run_main(capsys, monkeypatch, tmp_path):
    """``run_main(*args, module=...)``: the job's ``main(argv)`` in this process, as ``run_cli`` would see it:
    the exit code (main's return value, or argparse's SystemExit), stdout and stderr. Fails the test if the job
    calls ``ray.init``."""
    import ray

    monkeypatch.chdir(ROOT)  # relative paths (configs/...) resolve as they do for `python -m` from the repo
    monkeypatch.setenv("ELASTIC_TRAIN_HOME", str(tmp_path))
    started: list[tuple] = []

    def no_ray(*args, **kwargs):
        started.append((args, kwargs))
        raise AssertionError(f"bad input started Ray: ray.init(*{args}, **{kwargs})")

    monkeypatch.setattr(ray, "init", no_ray)

    def run(*args: str, module: str = "jobs.train") -> Ran:
        was_up = ray.is_initialized()  # the whole suite may have a session Ray up already
        main = importlib.import_module(module).main
        capsys.readouterr()
        try:
            rc = main(list(args))
        except SystemExit as e:  # argparse: usage errors (2) and --help (0)
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out = capsys.readouterr()
        assert not started, started
        assert ray.is_initialized() == was_up  # Ray was never started
        return Ran(rc, out.out, out.err)

    return run
