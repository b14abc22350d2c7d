"""The data order (DESIGN invariant 3): a pure function of ``(seed, epoch)``, cut per worker by the BatchPlan.

Each epoch is a seeded permutation of the training set cut into global batches of G samples (the ragged tail is
dropped so every optimizer step sees exactly G); global step ``s`` consumes global batch ``s`` and worker ``r``
takes its :class:`~elastic_train.data.batching.BatchPlan` slice. Resuming at ``(epoch, step)`` on any world size
therefore neither repeats nor skips a sample.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from elastic_train.data.batching import BatchPlan


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The order of the training set in ``epoch``: a pure function of (seed, epoch)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch + 1))


def steps_per_epoch(n_train: int, global_batch_size: int) -> int:
    """Optimizer steps per epoch; the ragged tail (< G samples) is dropped so every step sees exactly G."""
    return n_train // global_batch_size


class ElasticSampler:
    """The micro-batch index lists one worker consumes, for any (epoch, start step, world size)."""

    def __init__(self, n_train: int, plan: BatchPlan, rank: int, seed: int):
        self.n, self.plan, self.rank, self.seed = n_train, plan, rank, seed
        self.steps = steps_per_epoch(n_train, plan.global_batch_size)
        self._slices = plan.micro_slices(rank)

    def global_batch(self, epoch: int, step: int) -> torch.Tensor:
        g = self.plan.global_batch_size
        return epoch_permutation(self.seed, epoch, self.n)[step * g : (step + 1) * g]

    def steps_from(self, epoch: int, start_step: int) -> Iterator[tuple[int, list[torch.Tensor]]]:
        """Yield ``(step, [micro-batch indices])`` for this worker from ``start_step`` to the epoch end."""
        perm = epoch_permutation(self.seed, epoch, self.n)
        g = self.plan.global_batch_size
        for step in range(start_step, self.steps):
            batch = perm[step * g : (step + 1) * g]
            yield step, [batch[a:b] for a, b in self._slices]


class _MicroBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Feeds a DataLoader the micro-batch index lists of one worker, in order."""

    def __init__(self, sampler: ElasticSampler, epoch: int, start_step: int):
        self.sampler, self.epoch, self.start_step = sampler, epoch, start_step

    def __iter__(self) -> Iterator[list[int]]:
        for _, micro in self.sampler.steps_from(self.epoch, self.start_step):
            for idx in micro:
                if len(idx):
                    yield idx.tolist()

    def __len__(self) -> int:
        nonempty = sum(1 for a, b in self.sampler._slices if b > a)
        return (self.sampler.steps - self.start_step) * nonempty
