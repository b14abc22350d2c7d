"""Metric arithmetic: aggregation windows over workers, throughput, FLOPs and MFU. No Ray, no MLflow.

A :class:`Window` accumulates per-step sums on the device (no host sync per step) and all-reduces them at log
cadence, together with rank 0's control flags, in one small collective.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_train.data import DataSpec
from elastic_train.train.loop import StepResult
from elastic_train.train.strategy import unwrap, world_size

if TYPE_CHECKING:  # pydantic-free at run time
    from elastic_train.config import JobConfig

FIELDS = 5  # loss_sum, correct, grad_norm_sum, samples, steps

# Dense bf16 peak TFLOP/s per device (no sparsity), by a substring of torch.cuda.get_device_name().
PEAK_TFLOPS_BF16 = {"H200": 989.0, "H100": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0,
                    "A10G": 125.0, "L4": 121.0, "V100": 125.0}


class Window:
    """Sums since the last log point; reduced over workers with :meth:`reduce`."""

    def __init__(self, device: torch.device):
        self.device = device
        self.warm = False  # the first window of an attempt includes warm-up (compile, allocator)
        self._first = True
        self.reset()

    def reset(self, since: float | None = None) -> None:
        """Start a new window at ``since`` (a ``perf_counter`` reading; default now). The loop passes the previous
        window's end, so the work done between two windows (reducing, logging) counts in the next one's time."""
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        self.loss_sum, self.correct, self.grad_norm_sum = zero.clone(), zero.clone(), zero.clone()
        self.samples = self.count = self.norms = 0
        self.data_wait_s = 0.0
        self.t0 = time.perf_counter() if since is None else since

    def add(self, r: StepResult) -> None:
        self.loss_sum += r.loss_sum
        self.correct += r.correct
        if r.grad_norm is not None:
            self.grad_norm_sum += r.grad_norm
            self.norms += 1
        self.samples += r.samples
        self.count += 1

    @property
    def empty(self) -> bool:
        return self.count == 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def reduce(self, rank: int, flags: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
        """Sum the window over all workers; the flags are rank 0's decisions (booleans, or numbers >= 0),
        broadcast in the same call."""
        names = list(flags)
        own = [float(flags[n]) if rank == 0 else 0.0 for n in names]
        host = torch.tensor([float(self.samples), float(self.count), *own], dtype=torch.float64, device=self.device)
        buf = torch.cat([torch.stack([self.loss_sum, self.correct, self.grad_norm_sum]), host])
        world = world_size()
        if world > 1:
            dist.all_reduce(buf)
        values = buf.tolist()
        loss_sum, correct, grad_norm_sum, samples, steps = values[:5]
        totals = {
            "loss_sum": loss_sum, "correct": correct, "samples": samples, "grad_norm_sum": grad_norm_sum, "steps": steps
        }
        totals["grad_norm_sum"] /= world  # every worker holds the same (global) norm
        totals["grad_norms"] = self.norms  # how many steps measured it (the same on every worker)
        totals["steps"] /= world
        self.warm, self._first = not self._first, False
        return totals, _decoded(flags, values[FIELDS:])

    def reduce_flags(self, rank: int, flags: dict[str, Any]) -> dict[str, Any]:
        """Only rank 0's flags, broadcast (a sync point that logs nothing): one tiny all-reduce."""
        buf = torch.tensor([float(flags[n]) if rank == 0 else 0.0 for n in flags], dtype=torch.float64,
                           device=self.device)
        if world_size() > 1:
            dist.all_reduce(buf)
        return _decoded(flags, buf.tolist())


def _decoded(flags: dict[str, Any], values: list[float]) -> dict[str, Any]:
    """Reduced flag values as rank 0 meant them: booleans back to booleans, numbers as numbers."""
    return {n: (v > 0 if isinstance(flags[n], bool) else v) for n, v in zip(list(flags), values, strict=True)}


class Throughput:
    """Steady-state samples/s and data-wait share: the warm-up window of each attempt is left out."""

    def __init__(self) -> None:
        self.samples = self.seconds = self.all_samples = self.all_seconds = 0.0
        self.data_wait_s = self.all_data_wait_s = 0.0
        self.window_rates: deque[float] = deque(maxlen=10_000)  # per log window, for a robust median

    def add(self, samples: float, seconds: float, warm: bool, data_wait_s: float = 0.0) -> None:
        self.all_samples += samples
        self.all_seconds += seconds
        self.all_data_wait_s += data_wait_s
        if warm:
            self.samples += samples
            self.seconds += seconds
            self.data_wait_s += data_wait_s
            if seconds > 0:
                self.window_rates.append(samples / seconds)

    def median_rate(self) -> float:
        """Median over the steady log windows: insensitive to a neighbour's burst on a shared machine."""
        return statistics.median(self.window_rates) if self.window_rates else self.rate()

    def rate(self) -> float:
        if self.seconds > 0:
            return self.samples / self.seconds
        return self.all_samples / self.all_seconds if self.all_seconds > 0 else 0.0

    def data_wait_share(self) -> float:
        """Share of step time spent waiting for the next batch (first-use costs of the warm-up excluded)."""
        if self.seconds > 0:
            return self.data_wait_s / self.seconds
        return self.all_data_wait_s / self.all_seconds if self.all_seconds > 0 else 0.0


def interval_metrics(
    totals: dict[str, float], wall_s: float, data_wait_s: float, spec: DataSpec, flops_per_sample: float,
    device: torch.device, cfg: JobConfig,
) -> dict[str, float]:
    n = max(totals["samples"], 1.0)
    out = {
        "train_loss": totals["loss_sum"] / n,
        "train_accuracy": totals["correct"] / (n * spec.tokens_per_sample),
        "grad_norm": totals["grad_norm_sum"] / totals["grad_norms"] if totals.get("grad_norms") else None,
        "samples_per_second": totals["samples"] / wall_s if wall_s > 0 else 0.0,
        "data_wait_share": data_wait_s / wall_s if wall_s > 0 else 0.0,
    }
    if spec.kind == "language_model":
        out["tokens_per_second"] = out["samples_per_second"] * spec.tokens_per_sample
    peak = peak_flops(device, cfg)
    if peak:
        out["mfu"] = mfu(out["samples_per_second"] * flops_per_sample, peak, world_size())
    if device.type == "cuda":
        out["peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(device))
    return out


def eval_metrics(loss_sum: float, correct: float, n: float, spec: DataSpec) -> dict[str, float]:
    n = max(n, 1.0)
    out = {"val_loss": loss_sum / n, "val_accuracy": correct / (n * spec.tokens_per_sample)}
    if spec.kind == "language_model":
        out["val_perplexity"] = math.exp(min(out["val_loss"], 50.0))
    return out


def flops_per_sample(model: nn.Module, spec: DataSpec, cfg: JobConfig | Any = None) -> float:
    """Model FLOPs (forward + backward, no activation recomputation) to train on one sample.

    A model that knows its cost says so (``gpt``: ``6 N + 12 n_layer d_model T`` per token, see
    :meth:`elastic_train.models.gpt.GPT.flops_per_token`); any other model gets ``6 x parameters x tokens``.
    Parameters are counted whole (an FSDP shard's DTensor reports its global size).
    """
    core = unwrap(model)
    if hasattr(core, "flops_per_token"):
        return core.flops_per_token(spec.input_shape[0]) * spec.tokens_per_sample
    return 6.0 * sum(p.numel() for p in model.parameters()) * spec.tokens_per_sample


def peak_flops(device: torch.device, cfg: JobConfig) -> float | None:
    """Peak FLOP/s of one device: ``perf.peak_tflops``, else the bf16 table for known GPUs; None on CPU."""
    if cfg.perf.peak_tflops:
        return cfg.perf.peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_TFLOPS_BF16.items():
        if key in name:
            return tflops * 1e12
    return None


def mfu(achieved_flops_per_s: float, peak_flops_per_device: float, devices: int = 1) -> float:
    """Model FLOPs utilisation: FLOP/s achieved by all ``devices`` together / (their count x one's peak).

    ``achieved`` comes from the global rate (samples summed over every worker), so the denominator is every
    worker's device, not one.
    """
    peak = peak_flops_per_device * devices
    return achieved_flops_per_s / peak if peak > 0 else 0.0


def speed_text(stats: dict[str, float]) -> str:
    """The speed part of a progress line: samples/s, tokens/s, MFU, data-wait share, peak memory."""
    parts = [f"{stats['samples_per_second']:,.0f} samples/s"]
    if "tokens_per_second" in stats:
        parts.append(f"{stats['tokens_per_second']:,.0f} tok/s")
    if "mfu" in stats:
        parts.append(f"MFU {stats['mfu']:.1%}")
    parts.append(f"data wait {stats['data_wait_share']:.1%}")
    if "peak_memory_bytes" in stats:
        parts.append(f"peak mem {stats['peak_memory_bytes'] / 2**30:.1f} GiB")
    return " ".join(parts)


def perf_summary(
    throughput: Throughput, spec: DataSpec, flops_per_sample: float, device: torch.device, cfg: JobConfig
) -> dict[str, Any]:
    rate = throughput.rate()
    out: dict[str, Any] = {
        "tokens_per_second": rate * spec.tokens_per_sample,
        "data_wait_share": throughput.data_wait_share(),
    }
    peak = peak_flops(device, cfg)
    out["mfu"] = mfu(rate * flops_per_sample, peak, world_size()) if peak else None
    out["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return out
