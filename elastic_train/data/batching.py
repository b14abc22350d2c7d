"""BatchPlan: how one global batch of G samples is split over W workers and micro-batches.

The global batch is the hyperparameter; the world size is an implementation detail (DESIGN invariant 2).
For any W <= G every optimizer step consumes exactly the same G samples and its gradient is their mean:

* worker r takes the contiguous slice ``[start_r, end_r)`` of the global batch; slices differ by at most one
  sample when W does not divide G (we support uneven slices instead of refusing such W, so an elastic range
  like [1, 4] with G=256 keeps every size usable);
* each slice is cut into ``accum_steps`` micro-batches of at most ``micro_batch_cap`` samples;
* each micro-batch's loss is the *sum* of its per-sample losses times ``loss_scale = W / G``. DDP and FSDP
  average gradients over the W workers, so the applied gradient is ``sum over all G samples / G``, whatever
  W is and however unevenly the slices fall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class BatchPlan:
    global_batch_size: int
    world_size: int
    micro_batch_cap: int | None = None

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.global_batch_size < self.world_size:
            raise ValueError(
                f"global batch {self.global_batch_size} is smaller than the world size {self.world_size}"
            )
        if self.micro_batch_cap is not None and self.micro_batch_cap < 1:
            raise ValueError(f"micro_batch_cap must be >= 1, got {self.micro_batch_cap}")

    # ----------------------------------------------------------------------------- per-worker slices
    def slice_bounds(self, rank: int) -> tuple[int, int]:
        """Offsets of worker ``rank``'s samples inside the global batch (the first G % W ranks get one more)."""
        base, extra = divmod(self.global_batch_size, self.world_size)
        start = rank * base + min(rank, extra)
        return start, start + base + (1 if rank < extra else 0)

    def local_batch_size(self, rank: int) -> int:
        start, end = self.slice_bounds(rank)
        return end - start

    @property
    def max_local_batch(self) -> int:
        return math.ceil(self.global_batch_size / self.world_size)

    @property
    def even(self) -> bool:
        return self.global_batch_size % self.world_size == 0

    # ----------------------------------------------------------------------------- micro-batches
    @property
    def accum_steps(self) -> int:
        """Micro-batches per optimizer step; the same on every worker so DDP syncs once, on the last."""
        if self.micro_batch_cap is None:
            return 1
        return math.ceil(self.max_local_batch / self.micro_batch_cap)

    @property
    def micro_batch_size(self) -> int:
        """The largest micro-batch any worker runs."""
        return math.ceil(self.max_local_batch / self.accum_steps)

    def micro_slices(self, rank: int) -> list[tuple[int, int]]:
        """Micro-batch offsets within the global batch for ``rank``: ``accum_steps`` nearly equal parts.

        The larger parts come last so the final (gradient-syncing) micro-batch is never empty; empty
        leading parts are possible only for tiny batches and are skipped by the loop.
        """
        start, end = self.slice_bounds(rank)
        n, a = end - start, self.accum_steps
        base, extra = divmod(n, a)
        sizes = [base + (1 if i >= a - extra else 0) for i in range(a)]
        out, pos = [], start
        for size in sizes:
            out.append((pos, pos + size))
            pos += size
        return out

    @property
    def loss_scale(self) -> float:
        """Multiply a micro-batch's summed loss by this so the all-reduced gradient is the global mean."""
        return self.world_size / self.global_batch_size

    def describe(self) -> dict[str, int | bool]:
        return {
            "global_batch_size": self.global_batch_size,
            "world_size": self.world_size,
            "micro_batch_size": self.micro_batch_size,
            "accum_steps": self.accum_steps,
            "even_split": self.even,
        }

    def __str__(self) -> str:
        split = "even" if self.even else "uneven, loss-weighted"
        return (
            f"global batch {self.global_batch_size} = {self.world_size} workers x "
            f"{self.accum_steps} micro-batch(es) of <= {self.micro_batch_size} ({split})"
        )
