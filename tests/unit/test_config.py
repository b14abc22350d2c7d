"""Config precedence and every class of bad input: one ConfigError naming the field and the value."""

from __future__ import annotations

import pytest

from elastic_train import config
from elastic_train.config import ConfigError, load


def test_defaults_are_the_digits_preset():
    """One default: the built-in defaults are configs/digits.yaml's values (the preset only spells them out)."""
    from pathlib import Path

    cfg = load()
    assert cfg.data.name == "digits" and cfg.model.name == "mlp"
    assert cfg.scaling.num_workers == 2 and cfg.train.global_batch_size == 128
    assert cfg == load(Path(__file__).parents[2] / "configs" / "digits.yaml")


def test_precedence_defaults_file_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 0.5\n  epochs: 3\nmodel:\n  hidden_sizes: [8]\n")
    cfg = load(f, ["train.lr=0.25", "scaling.num_workers=[1,4]", "model.hidden_sizes=[256,256]"])
    assert cfg.train.lr == 0.25  # override beats file
    assert cfg.train.epochs == 3  # file beats default
    assert cfg.train.global_batch_size == 128  # default
    assert cfg.scaling.num_workers == (1, 4) and cfg.scaling.elastic
    assert cfg.model.hidden_sizes == [256, 256]


def test_override_values_are_yaml():
    cfg = load(None, ["train.compile=true", "train.grad_clip=null", "train.lr=1e-4", "scaling.use_gpu=false"])
    assert cfg.train.compile is True and cfg.train.grad_clip is None
    assert cfg.train.lr == pytest.approx(1e-4) and cfg.scaling.use_gpu is False


@pytest.mark.parametrize(
    "overrides, field, fragment",
    [
        (["train.lrr=1"], "train.lrr", "did you mean 'lr'"),
        (["trian.lr=1"], "trian", "unknown key"),
        (["train.lr=-1"], "train.lr", "greater than 0"),
        (["train.lr=abc"], "train.lr", "valid number"),
        (["train.epochs=0"], "train.epochs", "greater than 0"),
        (["train.global_batch_size=0"], "train.global_batch_size", "greater than 0"),
        (["train.optimizer=rmsprop"], "train.optimizer", "sgd"),
        (["scaling.num_workers=[3,1]"], "scaling.num_workers", "min (3) must be <= max (1)"),
        (["scaling.num_workers=-1"], "scaling.num_workers", ">= 1"),
        (["scaling.num_workers=[1,2,3]"], "scaling.num_workers", "[min, max]"),
        (["scaling.use_gpu=maybe"], "scaling.use_gpu", "auto, true or false"),
        (["checkpoint.every_steps=0"], "checkpoint.every_steps", "greater than 0"),
        (["checkpoint.every_seconds=0"], "checkpoint.every_seconds", "greater than 0"),
        (["checkpoint.score=loss"], "checkpoint.score", "not a reported metric"),
        (["failure.max_failures=-2"], "failure.max_failures", "-1"),
        (["train.global_batch_size=2", "scaling.num_workers=4"], "train.global_batch_size", "maximum worker count"),
        (["name=has space"], "name", "letters, digits"),
        (["train.lr"], "override", "section.key=value"),
        (["train.lr=[unclosed"], "train.lr", "not valid YAML"),
        (["seed.x=1"], "seed", "valid integer"),
    ],
)
def test_bad_input_names_field_and_value(overrides, field, fragment):
    with pytest.raises(ConfigError) as info:
        load(None, overrides)
    assert fragment in str(info.value)
    assert info.value.field == field
    assert field in str(info.value)


def test_missing_and_unparsable_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse YAML"):
        load(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="mapping"):
        load(scalar)


def test_flatten_and_with_overrides_round_trip():
    cfg = load(None, ["train.lr=0.01"])
    flat = config.flatten(cfg)
    assert flat["train.lr"] == 0.01 and flat["scaling.num_workers"] == 2
    trial = config.with_overrides(cfg, {"train.lr": 0.5, "train.global_batch_size": 64})
    assert trial.train.lr == 0.5 and trial.train.global_batch_size == 64 and cfg.train.lr == 0.01
    with pytest.raises(ConfigError, match="train.nope"):
        config.with_overrides(cfg, {"train.nope": 1})


def test_every_field_is_described():
    for name, field in config.JobConfig.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, config.Section):
            for key, f in section.model_fields.items():
                assert f.description, f"{name}.{key} has no description"


def test_presets_validate():
    from pathlib import Path

    for preset in sorted((Path(__file__).parents[2] / "configs").glob("*.yaml")):
        load(preset)
