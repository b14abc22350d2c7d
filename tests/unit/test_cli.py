"""Bad input through the real CLI: exit code 2, one line naming the field and the value, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def run_cli(*args: str, module: str = "jobs.train", env: dict | None = None) -> subprocess.CompletedProcess:
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
    ],
)
def test_bad_input_exits_2_with_one_line(args, needle):
    out = run_cli(*args)
    assert out.returncode == 2, out.stderr + out.stdout
    assert "Traceback" not in out.stderr + out.stdout
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], out.stderr
    assert "ray:" not in out.stdout  # Ray was never started


def test_unparsable_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {lr: [\n")
    out = run_cli("--config", str(bad))
    assert out.returncode == 2 and "cannot parse YAML" in out.stderr and "Traceback" not in out.stderr


def test_help_lists_the_submit_line():
    out = run_cli("--help")
    assert out.returncode == 0 and "ray job submit --working-dir ." in out.stdout and "--resume" in out.stdout


def test_resume_refuses_settings_that_would_break_the_checkpoint(tmp_path):
    from elastic_train.config import ConfigError
    from elastic_train.launch import run as driver
    from elastic_train.launch.storage import RunStorage

    store = RunStorage(str(tmp_path), "r1")
    store.save_config(driver.config_mod.load(None, ["name=r1"]).model_dump(mode="json"))
    (tmp_path / "r1" / "checkpoint_000000005").mkdir()
    (tmp_path / "r1" / "checkpoint_000000005" / "meta.json").write_text("{}")
    ok = driver.plan_launch(None, ["name=r1", f"checkpoint.storage_path={tmp_path}", "train.epochs=20"])
    assert ok.resuming and ok.cfg.train.epochs == 20  # training longer is fine
    for change, field in [("model.hidden_sizes=[8]", "model.hidden_sizes"), ("train.global_batch_size=64", "train.global_batch_size"),
                          ("scaling.strategy=fsdp", "scaling.strategy"), ("seed=3", "seed")]:
        with pytest.raises(ConfigError) as info:
            driver.plan_launch(None, ["name=r1", f"checkpoint.storage_path={tmp_path}", change])
        assert info.value.field == field and "resumed" in str(info.value)
