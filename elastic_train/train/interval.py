"""``checkpoint.every_steps=auto``: the checkpoint interval at the Young–Daly optimum, from measured costs.

Pure Python (no torch, no Ray): the engine (train/session.py) and the goodput simulator (bench/goodput_sim.py)
call the same :func:`choose`.

* **Optimum** (Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9); Daly
  2006, FGCS 22(3)): ``T = sqrt(2 * C * M)`` seconds of training between checkpoints, with ``C`` the time one
  checkpoint takes until it is durable: what training waits for (save + report + the validation it runs + the wait
  for the previous upload, train/uploads.py) plus its upload after the hand-off. On a local disk the upload is
  milliseconds; on object storage it can be most of the cost, and an interval shorter than one upload only makes
  the next checkpoint wait for it. ``M`` is the run's mean time between failures. Converted to steps with the
  measured step time, rounded, never below ``floor`` (``checkpoint.min_every_steps``).
* **The failure rate** is a Gamma–Poisson posterior mean. The prior ``failure.mtbf_s`` is per worker (its node
  or GPU); a run of ``W`` workers fails at ``W / mtbf_s`` per second; it counts as ``PRIOR_FAILURES`` (one)
  pseudo-failure over ``PRIOR_FAILURES * mtbf_s / W`` pseudo-seconds. With ``n`` restarts observed over ``t``
  seconds of the run's wall: ``M = (PRIOR_FAILURES * mtbf_s / W + t) / (PRIOR_FAILURES + n)``. Without a prior:
  ``M = t / n`` once a failure is seen. The prior dominates a young run; the run's own record takes over as
  its wall and failures grow (CheckFreq, FAST '21, tunes the interval online in the same spirit).
* **No failure seen and no prior**: no choice (``None``): the run keeps the configured cadence
  (``checkpoint.every_seconds``, epoch ends): today's default behaviour.
* Until a checkpoint has been measured (``checkpoints == 0``) or a step timed, there is no choice either.

Every input comes from the goodput totals (train/state.py ``Goodput``), which travel in every checkpoint and
in the run's ledger: a restart or a resumed job decides again from what the run has learned.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

PRIOR_FAILURES = 1.0  # the prior's weight, in pseudo-failures (Gamma shape)


@dataclass(frozen=True)
class Choice:
    """One decision: the interval in steps and everything it was computed from."""

    every_steps: int
    interval_s: float  # the Young–Daly optimum, seconds of training between checkpoints
    checkpoint_cost_s: float  # until durable: blocking_s + upload_s
    blocking_s: float  # what training waited for, per checkpoint
    upload_s: float  # hand-off to durable, per checkpoint
    mtbf_s: float  # the run's (posterior) mean time between failures
    step_s: float
    restarts: int
    wall_s: float
    prior_mtbf_s: float | None  # per worker
    workers: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        prior = f", prior {self.prior_mtbf_s:g} s per worker x {self.workers}" if self.prior_mtbf_s else ""
        upload = f" + upload {self.upload_s * 1000:.0f} ms" if self.upload_s >= 0.0005 else ""
        return (f"checkpoint interval (auto): every {self.every_steps} steps = {self.every_steps * self.step_s:.1f} s "
                f"(Young-Daly {self.interval_s:.1f} s: checkpoint {self.blocking_s * 1000:.0f} ms{upload}, MTBF "
                f"{self.mtbf_s:.0f} s from {self.restarts} restart(s) in {self.wall_s:.0f} s{prior}; step "
                f"{self.step_s * 1000:.0f} ms)")


def mtbf(restarts: int, wall_s: float, prior_mtbf_s: float | None, workers: int) -> float | None:
    """The run's mean time between failures: the Gamma–Poisson posterior mean (None: nothing to go on)."""
    shape, exposure = float(restarts), max(0.0, wall_s)
    if prior_mtbf_s:
        shape += PRIOR_FAILURES
        exposure += PRIOR_FAILURES * prior_mtbf_s / max(1, workers)
    if shape <= 0 or exposure <= 0:
        return None
    return exposure / shape


def young_daly_s(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """Seconds of training between checkpoints that minimise the expected loss (Young's first-order optimum)."""
    return math.sqrt(2.0 * max(0.0, checkpoint_cost_s) * max(0.0, mtbf_s))


def choose(*, checkpoint_s: float, checkpoints: int, step_s: float | None, restarts: int, wall_s: float,
           prior_mtbf_s: float | None, workers: int, floor: int = 1, upload_s: float = 0.0) -> Choice | None:
    """The interval for the run as it stands; None: keep the configured cadence (see the module docstring).

    ``checkpoint_s`` is the run's total blocking time in its ``checkpoints`` checkpoints; ``upload_s`` the mean
    time from a checkpoint's hand-off until it is durable (0: not measured yet); ``step_s`` the measured time of
    one optimizer step; ``restarts`` over ``wall_s`` the run's own failure record."""
    m = mtbf(restarts, wall_s, prior_mtbf_s, workers)
    if m is None or checkpoints <= 0 or not step_s or step_s <= 0:
        return None
    blocking = checkpoint_s / checkpoints
    cost = blocking + max(0.0, upload_s)
    interval = young_daly_s(cost, m)
    steps = max(int(floor), int(round(interval / step_s)), 1)
    return Choice(steps, interval, cost, blocking, max(0.0, upload_s), m, step_s, restarts, wall_s, prior_mtbf_s,
                  workers)


def choose_from_totals(totals: Any, global_step: int, prior_mtbf_s: float | None, workers: int,
                       floor: int = 1) -> Choice | None:
    """:func:`choose` from a goodput ``Goodput`` (its fields: productive, checkpoint and eval seconds, the
    checkpoint count, the uploads measured, restarts, and the accounted wall) at ``global_step``: the step time
    is the productive time over the steps the run kept."""
    wall = totals.productive_s + totals.checkpoint_s + totals.eval_s + totals.restart_lost_s + totals.startup_s
    step_s = totals.productive_s / global_step if global_step > 0 else None
    upload_s = totals.upload_s / totals.uploads if getattr(totals, "uploads", 0) else 0.0
    return choose(checkpoint_s=totals.checkpoint_s + totals.eval_s, checkpoints=totals.checkpoints, step_s=step_s,
                  restarts=totals.restarts, wall_s=wall, prior_mtbf_s=prior_mtbf_s, workers=workers, floor=floor,
                  upload_s=upload_s)
