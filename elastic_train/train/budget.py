"""How long a run trains: ``train.epochs``, or a language-model budget ``train.max_steps`` / ``train.max_tokens``.

One :class:`Budget` per run, derived from the config and the data (steps per epoch, tokens per sample): the
loop stops on it, the LR schedule spans it (warmup, then cosine down to ``min_lr_ratio`` exactly at its last
step) and the console counts against it. The data order is untouched: a step budget runs through as many
epochs of the invariant-3 order as it needs, and stops mid-epoch when it is spent. A resume restores the step
and the schedule; the budget comes from the same stored config, so it is kept. No Ray, no MLflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from elastic_train.errors import ConfigError

if TYPE_CHECKING:  # pydantic-free at run time
    from elastic_train.config import TrainConfig
    from elastic_train.train.state import Progress


@dataclass(frozen=True)
class Budget:
    by: str  # "epochs" | "max_steps" | "max_tokens"
    total_steps: int
    steps_per_epoch: int
    epochs: int  # whole epochs (the last one possibly cut short by a step budget)

    @classmethod
    def of(cls, train: TrainConfig, steps_per_epoch: int, tokens_per_sample: int = 1) -> Budget:
        """The run's budget; ConfigError when a token budget is smaller than one optimizer step."""
        spe = max(1, steps_per_epoch)
        if train.max_steps is not None:
            return cls("max_steps", train.max_steps, spe, math.ceil(train.max_steps / spe))
        if train.max_tokens is not None:
            per_step = train.global_batch_size * tokens_per_sample
            steps = train.max_tokens // per_step
            if steps < 1:
                raise ConfigError("train.max_tokens", train.max_tokens,
                                  f"smaller than one optimizer step ({per_step} tokens = global_batch_size "
                                  f"{train.global_batch_size} x {tokens_per_sample} tokens per sample)")
            return cls("max_tokens", steps, spe, math.ceil(steps / spe))
        return cls("epochs", train.epochs * spe, spe, train.epochs)

    def done(self, p: Progress) -> bool:
        if self.by == "epochs":
            return p.epoch >= self.epochs
        return p.global_step >= self.total_steps

    def label(self, p: Progress) -> str:
        """``epoch 2/10 step 57`` for epoch budgets; ``step 57/1000`` (and the epoch) for step/token budgets."""
        if self.by == "epochs":
            return f"epoch {p.epoch_label()}/{self.epochs} step {p.global_step}"
        return f"step {p.global_step}/{self.total_steps} (epoch {p.epoch_label()})"
