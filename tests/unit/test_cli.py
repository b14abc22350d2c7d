"""Bad input through the CLI: exit code 2, one line naming the field and the value, no traceback, Ray never
started. Most checks call the job's ``main(argv)`` in this process (a subprocess costs seconds of imports each);
two real ``python -m jobs.train`` processes (marked ``subprocess``) keep the entry point itself honest."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jobs._cli import common_parser
from tests.conftest import ROOT


def run_cli(*args: str, module: str = "jobs.train", env: dict | None = None) -> subprocess.CompletedProcess:
    """A real ``python -m MODULE ARGS`` process (tests/unit/test_sweep_config.py uses this too)."""
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["trian.lr=0.1"], "trian"),
        (["train.lrr=0.1"], "train.lrr"),
        (["train.lr=-1"], "train.lr=-1"),
        (["train.epochs=0"], "train.epochs=0"),
        (["train.global_batch_size=0"], "train.global_batch_size=0"),
        (["train.epochs=ten"], "train.epochs='ten'"),
        (["scaling.num_workers=[4,2]"], "scaling.num_workers=[4, 2]"),
        (["scaling.num_workers=-1"], "scaling.num_workers=-1"),
        (["failure.max_failures=-2"], "failure.max_failures=-2"),
        (["checkpoint.every_steps=0"], "checkpoint.every_steps=0"),
        (["checkpoint.every_seconds=0"], "checkpoint.every_seconds=0"),
        (["model.name=resnet9000"], "model.name='resnet9000'"),
        (["data.name=imagenet"], "data.name='imagenet'"),
        (["model.name=no.such.module:build"], "model.name='no.such.module:build'"),
        (["data.name=tests.helpers.user_code:not_a_dataset"], "data.name="),
        (["model.name=tests.helpers.user_code:not_a_model"], "model.name="),
        (["train.global_batch_size=5000"], "train.global_batch_size=5000"),
        (["train.lr"], "override='train.lr'"),
        (["--config", "configs/nope.yaml"], "--config='configs/nope.yaml'"),
        (["--resume", "never-ran", "checkpoint.storage_path=/tmp/et-nothing-here"], "--resume='never-ran'"),
        (["--bogus-flag"], "--bogus-flag"),
        # overrides anywhere on the line (Hydra, torchrun): the one after the option still reaches validation
        (["train.lr=1e-3", "--summary-json", "s.json", "train.epochs=0"], "error: train.epochs=0"),
        # an override written as an option: say how to write it
        (["--train.lr=0.1"], "overrides take no dashes: write train.lr=0.1"),
        (["train.epochs=2", "--train.lr", "0.1"], "overrides take no dashes: write train.lr=0.1"),
    ],
)
def test_bad_input_exits_2_with_one_line(run_main, args, needle):
    out = run_main(*args)
    assert out.returncode == 2, out.stderr + out.stdout
    assert "Traceback" not in out.stderr + out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "ray:" not in out.stdout  # Ray was never started


def test_unparsable_yaml(run_main, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {lr: [\n")
    out = run_main("--config", str(bad))
    assert out.returncode == 2 and "cannot parse YAML" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("module", ["jobs.train", "jobs.sweep", "jobs.preflight"])
@pytest.mark.parametrize("file_text, overrides, message", [
    # a YAML syntax error keeps its line and column
    ("train:\n  lr: 0.1\n\tepochs: 3\n", [],
     "cannot parse YAML (line 3, column 1: found character '\\t' that cannot start any token)"),
    # a one-item shorthand names the value as written, not `.0=None`
    (None, ["tracking.log_checkpoints=bestt"],
     "error: tracking.log_checkpoints='bestt': Input should be 'none', 'last', 'best' or 'all'"),
    # a flat file: the key lives in a section
    ("lr: 0.001\n", [], "error: lr=0.001: unknown key in top level; did you mean 'train.lr'?"),
    # case-insensitive, and section-aware
    (None, ["train.LR=1e-3"], "error: train.LR=0.001: unknown key in train; did you mean 'lr'?"),
    (None, ["train.num_workers=4"],
     "error: train.num_workers=4: unknown key in train; did you mean 'scaling.num_workers'?"),
    (None, ["--config", "configs"],
     "error: --config='configs': is a folder; name a YAML file in it, e.g. configs/digits.yaml"),
])
def test_errors_keep_their_facts(run_main, tmp_path, module, file_text, overrides, message):
    args = list(overrides)
    if file_text is not None:
        (tmp_path / "c.yaml").write_text(file_text)
        args = ["--config", str(tmp_path / "c.yaml"), *args]
    out = run_main(*args, module=module)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and message in out.stderr, out.stderr
    assert out.stdout == ""  # nothing that looks like a run started


@pytest.mark.parametrize("module", ["jobs.train", "jobs.sweep", "jobs.preflight"])
@pytest.mark.parametrize("override, message", [
    ("data.name=no_such_module:build", "error: data.name='no_such_module:build': cannot import 'no_such_module' "
                                       "(ModuleNotFoundError: No module named 'no_such_module')"),
    ("model.name=tests.helpers.user_code:not_a_model",
     "error: model.name='tests.helpers.user_code:not_a_model': must return a torch.nn.Module, got str"),
])
def test_a_bad_import_prints_nothing_before_the_error(run_main, module, override, message):
    out = run_main(override, module=module)
    assert out.returncode == 2 and out.stderr.strip() == message, out.stderr
    assert out.stdout == ""  # no `run NAME: storage PATH` line: no run started


def test_overrides_may_come_anywhere_on_the_line():
    parser = common_parser("a job")
    parser.add_argument("--summary-json", metavar="PATH")
    parser.add_argument("--resume", metavar="NAME")
    args = parser.parse_args(["train.lr=1e-3", "--summary-json", "s.json", "train.epochs=2", "--config=c.yaml",
                              "seed=3", "--resume", "r1"])
    assert args.overrides == ["train.lr=1e-3", "train.epochs=2", "seed=3"]
    assert (args.summary_json, args.config, args.resume) == ("s.json", "c.yaml", "r1")
    assert parser.parse_args([]).overrides == []


@pytest.mark.parametrize("argv, hint", [
    (["--train.lr=0.1"], "write train.lr=0.1"),
    (["-train.lr=0.1"], "write train.lr=0.1"),
    (["--model.hidden_sizes=[8, 8]"], "write model.hidden_sizes=[8, 8]"),
    (["--train.lr", "0.1"], "write train.lr=0.1"),
    (["--train.lr"], "write train.lr=VALUE"),
])
def test_dashed_overrides_exit_2_with_a_hint(capsys, argv, hint):
    with pytest.raises(SystemExit) as info:
        common_parser("a job").parse_args(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and f"overrides take no dashes: {hint}" in err and len(err.splitlines()) == 1


@pytest.mark.subprocess
def test_bad_input_in_a_real_process():
    """The entry point itself (``python -m``, ``sys.exit(main())``): exit 2, one line, Ray never started."""
    out = run_cli("trian.lr=0.1")
    assert out.returncode == 2, out.stderr + out.stdout
    assert "Traceback" not in out.stderr + out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "trian" in lines[0], out.stderr
    assert "ray:" not in out.stdout


@pytest.mark.subprocess
def test_help_lists_the_submit_line():
    out = run_cli("--help")
    assert out.returncode == 0 and "ray job submit --working-dir ." in out.stdout and "--resume" in out.stdout


def test_resume_refuses_settings_that_would_break_the_checkpoint(tmp_path):
    from elastic_train import config as config_mod
    from elastic_train.config import ConfigError
    from elastic_train.launch import context
    from elastic_train.launch.storage import RunStorage

    store = RunStorage(str(tmp_path), "r1")
    store.save_config(config_mod.load(None, ["name=r1"]).model_dump(mode="json"))
    (tmp_path / "r1" / "checkpoint_000000005").mkdir()
    (tmp_path / "r1" / "checkpoint_000000005" / "meta.json").write_text("{}")
    ok = context.plan(None, ["name=r1", f"checkpoint.storage_path={tmp_path}", "train.epochs=20"])
    assert ok.resuming and ok.cfg.train.epochs == 20  # training longer is fine
    for change, field in [("model.hidden_sizes=[8]", "model.hidden_sizes"),
                          ("train.global_batch_size=64", "train.global_batch_size"),
                          ("scaling.strategy=fsdp", "scaling.strategy"), ("seed=3", "seed")]:
        with pytest.raises(ConfigError) as info:
            context.plan(None, ["name=r1", f"checkpoint.storage_path={tmp_path}", change])
        assert info.value.field == field and "resumed" in str(info.value)
