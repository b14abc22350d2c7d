"""The CLI explains itself: one ``elastic-train`` command with a subcommand per job, ``--help`` with the real
program name and the config reference, ``--print-config`` (nothing started) that round-trips, and
``elastic-train ui`` on the store the jobs use."""

from __future__ import annotations

import os

import pytest
import yaml

from elastic_train.config import load
from jobs import cli
from tests.conftest import ROOT


@pytest.fixture
def no_start(monkeypatch, tmp_path):
    """Run in the repo with a private home; fail the test if anything calls ``ray.init``."""
    import ray

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("ELASTIC_TRAIN_HOME", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def refuse(*args, **kwargs):
        raise AssertionError("started Ray")

    monkeypatch.setattr(ray, "init", refuse)
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = cli.main(list(argv))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 0
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_the_console_script_is_the_dispatcher():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"elastic-train": "jobs.cli:main"}


def test_help_lists_every_command(capsys):
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "usage: elastic-train COMMAND" in out and "docs/config.md" in out
    for name in cli.COMMANDS:
        assert f"\n  {name} " in out
    assert run(capsys)[0] == 2
    rc, _, err = run(capsys, "trian")
    assert rc == 2 and err.strip() == (
        f"error: unknown command 'trian'; choose one of {', '.join(cli.COMMANDS)} (see elastic-train --help)"
    )


@pytest.mark.parametrize("name", ["train", "sweep", "evaluate", "preflight", "ui"])
def test_subcommand_help_names_the_program(capsys, name):
    rc, out, _ = run(capsys, name, "--help")
    assert rc == 0 and out.startswith(f"usage: elastic-train {name} ") and "train.py" not in out
    if name != "ui":
        assert "Every config key, its default and meaning: docs/config.md" in out and "--print-config" in out
    module = __import__(cli.COMMANDS[name], fromlist=["main"])
    with pytest.raises(SystemExit):
        module.main(["--help"])
    assert capsys.readouterr().out.startswith(f"usage: python -m {cli.COMMANDS[name]} ")


def test_dashed_override_hint_through_the_dispatcher(capsys, no_start):
    rc, _, err = run(capsys, "train", "--train.lr=1e-3")
    assert rc == 2 and err.strip() == "error: overrides take no dashes: write train.lr=1e-3 (see --help)"


@pytest.mark.parametrize("name, config", [("train", "configs/digits.yaml"), ("sweep", "configs/sweep-digits.yaml"),
                                          ("preflight", None)])
def test_print_config_round_trips_and_starts_nothing(capsys, no_start, name, config):
    args = [*(["--config", config] if config else []), "train.lr=1e-3", "scaling.num_workers=[1,4]"]
    rc, out, err = run(capsys, name, *args, "--print-config")
    assert rc == 0 and err == "", err
    printed = yaml.safe_load(out)
    assert printed["train"]["lr"] == 1e-3 and printed["scaling"]["num_workers"] == [1, 4]
    assert not (no_start / "results").exists() and not (no_start / "mlflow.db").exists()  # nothing written
    again = no_start / "printed.yaml"
    again.write_text(out)
    expected = load(config, ["train.lr=1e-3", "scaling.num_workers=[1,4]"])
    if name == "sweep":  # what the sweep will run: its own defaults applied (sweep/plan.py), each said in one line
        from elastic_train.sweep.plan import spares_from_the_first_step

        expected = spares_from_the_first_step(expected)[0]
    assert load(again) == expected
    rc, out2, _ = run(capsys, name, "--config", str(again), "--print-config")
    assert rc == 0 and out2 == out


def test_print_config_still_refuses_bad_input(capsys, no_start):
    rc, out, err = run(capsys, "train", "train.lr=-1", "--print-config")
    assert rc == 2 and out == "" and err.startswith("error: train.lr=-1")


def test_ui_opens_the_store_the_jobs_use(capsys, no_start, monkeypatch):
    rc, out, _ = run(capsys, "ui", "--print-uri")
    assert rc == 0 and out.strip() == f"sqlite:///{no_start / 'mlflow.db'}"
    rc, out, _ = run(capsys, "ui", f"tracking.uri={no_start / 'elsewhere'}", "--print-uri")
    assert out.strip() == f"sqlite:///{no_start / 'elsewhere' / 'mlflow.db'}"
    rc, _, err = run(capsys, "ui")
    assert rc == 2 and f"error: no MLflow store at {no_start / 'mlflow.db'} yet" in err
    rc, out, _ = run(capsys, "ui", "tracking.uri=http://mlflow.example:5000")
    assert rc == 0 and "tracking server http://mlflow.example:5000" in out
    (no_start / "mlflow.db").write_bytes(b"")
    execs: list[list[str]] = []
    monkeypatch.setattr(os, "execv", lambda path, argv: execs.append(argv))  # do not become the server
    rc, out, _ = run(capsys, "ui", "--port", "5123")
    assert out.startswith(f"MLflow UI for sqlite:///{no_start / 'mlflow.db'} on http://127.0.0.1:5123")
    assert execs and execs[0][1:] == ["-m", "mlflow", "ui", "--backend-store-uri",
                                      f"sqlite:///{no_start / 'mlflow.db'}", "--host", "127.0.0.1", "--port", "5123"]


@pytest.mark.subprocess
def test_real_processes_name_themselves():
    """``python -m jobs.cli`` (what the console script runs) and ``python -m jobs.train`` as real processes."""
    import subprocess
    import sys

    def helps(*args: str) -> str:
        out = subprocess.run([sys.executable, "-m", *args, "--help"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert helps("jobs.cli", "sweep").startswith("usage: elastic-train sweep ")
    assert helps("jobs.train").startswith("usage: python -m jobs.train ")


@pytest.mark.parametrize("job", ["train", "sweep"])
def test_the_console_script_tells_a_job_it_is_the_program(monkeypatch, job):
    """``elastic-train train ...`` is the process's program (its wall counts from the process start, it exits
    without the interpreter's teardown); ``cli.main([...])`` called in-process is not. Told as an argument,
    not through a module global."""
    import importlib

    seen: dict[str, object] = {}
    module = importlib.import_module(f"jobs.{job}")
    monkeypatch.setattr(module, "main", lambda argv, prog, program=None: seen.update(program=program) or 0)
    monkeypatch.setattr("sys.argv", ["elastic-train", job, "--help"])
    assert cli.main() == 0 and seen["program"] is True
    assert cli.main([job, "--help"]) == 0 and seen["program"] is False
