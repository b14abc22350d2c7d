"""Model registry: ``mlp``, ``cnn``, ``gpt``, or a user's ``'package.module:function'``.

A user function is called as ``fn(spec=DataSpec, **model.options)`` and must return an ``nn.Module`` whose
forward maps a batch of inputs to logits ``(batch, num_classes)`` (or ``(batch, seq, vocab)`` for language
models).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from elastic_train.data.spec import DataSpec
from elastic_train.errors import ConfigError
from elastic_train.plugins import resolve_import

if TYPE_CHECKING:  # pydantic-free at run time
    from elastic_train.config import JobConfig, ModelConfig


class MLP(nn.Module):
    """Flatten -> [Linear -> GELU -> Dropout] x len(hidden_sizes) -> Linear."""

    def __init__(self, in_features: int, hidden_sizes: list[int], num_classes: int, dropout: float = 0.0):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for h in hidden_sizes:
            layers += [nn.Linear(width, h), nn.GELU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCNN(nn.Module):
    """[Conv3x3 -> GroupNorm -> GELU] per channel width, global average pool, dropout, linear head.

    GroupNorm rather than BatchNorm: per-sample normalisation keeps the result independent of how the
    global batch is split over workers (BatchNorm statistics would depend on the world size).
    """

    def __init__(self, in_channels: int, channels: list[int], num_classes: int, dropout: float = 0.0):
        super().__init__()
        blocks: list[nn.Module] = []
        width = in_channels
        for c in channels:
            blocks += [nn.Conv2d(width, c, 3, padding=1), nn.GroupNorm(min(8, c), c), nn.GELU()]
            width = c
        self.features = nn.Sequential(*blocks)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(width, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def _mlp(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    _require_classification(cfg, spec)
    return MLP(math.prod(spec.input_shape), cfg.hidden_sizes, spec.num_classes, cfg.dropout)


def _cnn(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    _require_classification(cfg, spec)
    if len(spec.input_shape) != 3:
        raise ConfigError(
            "model.name", cfg.name, f"needs image data shaped (C, H, W); this dataset gives {spec.input_shape}"
        )
    return SmallCNN(spec.input_shape[0], cfg.channels, spec.num_classes, cfg.dropout)


def _gpt(cfg: ModelConfig, spec: DataSpec) -> nn.Module:
    from elastic_train.models.gpt import build_gpt  # the transformer lives in its own module; imported on use

    return build_gpt(cfg, spec)


def _require_classification(cfg: ModelConfig, spec: DataSpec) -> None:
    if spec.kind != "classification":
        raise ConfigError("model.name", cfg.name, f"is a classifier; this dataset is a {spec.kind} task (use gpt)")


BUILTIN: dict[str, Callable[[ModelConfig, DataSpec], nn.Module]] = {"mlp": _mlp, "cnn": _cnn, "gpt": _gpt}


def build_model(cfg: JobConfig, spec: DataSpec) -> nn.Module:
    """Build the configured model with a seeded initialisation (identical on every worker)."""
    name = cfg.model.name
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        if name in BUILTIN:
            model = BUILTIN[name](cfg.model, spec)
        elif ":" in name:
            fn = resolve_import(name, "model.name")
            try:
                model = fn(spec=spec, **cfg.model.options)
            except Exception as e:  # a user function failing is a config problem
                raise ConfigError("model.name", name, f"raised {type(e).__name__}: {e}") from None
        else:
            known = ", ".join(sorted(BUILTIN))
            raise ConfigError("model.name", name, f"unknown model; built-ins: {known}, or 'package.module:function'")
    if not isinstance(model, nn.Module):
        raise ConfigError("model.name", name, f"must return a torch.nn.Module, got {type(model).__name__}")
    if cfg.train.activation_checkpointing and hasattr(model, "set_activation_checkpointing"):
        model.set_activation_checkpointing(True)  # gpt (and any user model offering the same method)
    return model


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
