"""Typed job configuration: the schema (:mod:`.schema`, one pydantic model per concern) and the reading of it
(:mod:`.parse`: YAML files, dotted overrides, a stored run's config, layered, validated, every mistake one
:class:`ConfigError` naming the dotted field and the bad value). Import from here; the split is for readers."""

from elastic_train.config.parse import (
    FROZEN_ON_RESUME,
    NumberLoader,
    compose,
    deep_merge,
    flatten,
    layer,
    leaf_keys,
    load,
    load_yaml,
    parse_overrides,
    read_yaml,
    refuse_incompatible_resume,
    set_dotted,
    validate,
    with_overrides,
)
from elastic_train.config.schema import (
    NAME_PATTERN,
    SCORE_METRICS,
    CheckpointConfig,
    DataConfig,
    Distribution,
    FailureConfig,
    JobConfig,
    ModelConfig,
    PerfConfig,
    ScalingConfig,
    Section,
    SweepConfig,
    TrackingConfig,
    TrainConfig,
)
from elastic_train.errors import ConfigError  # defined without pydantic: the torch-only modules raise it too

__all__ = [
    "FROZEN_ON_RESUME", "NAME_PATTERN", "SCORE_METRICS", "CheckpointConfig", "ConfigError", "DataConfig",
    "Distribution", "FailureConfig", "JobConfig", "ModelConfig", "NumberLoader", "PerfConfig", "ScalingConfig",
    "Section", "SweepConfig", "TrackingConfig", "TrainConfig", "compose", "deep_merge", "flatten", "layer",
    "leaf_keys", "load", "load_yaml", "parse_overrides", "read_yaml", "refuse_incompatible_resume", "set_dotted",
    "validate", "with_overrides",
]
