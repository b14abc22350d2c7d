"""Metric arithmetic: aggregation windows over workers, throughput, FLOPs and MFU. No Ray, no MLflow.

A :class:`Window` accumulates per-step sums on the device (no host sync per step) and all-reduces them at log
cadence, together with rank 0's control flags, in one small collective.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from elastic_train.data import DataSpec
from elastic_train.loop import StepResult

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

    def reset(self) -> None:
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        self.loss_sum, self.correct, self.grad_norm_sum = zero.clone(), zero.clone(), zero.clone()
        self.samples = self.count = 0
        self.data_wait_s = 0.0
        self.t0 = time.perf_counter()

    def add(self, r: StepResult) -> None:
        self.loss_sum += r.loss_sum
        self.correct += r.correct
        self.grad_norm_sum += r.grad_norm
        self.samples += r.samples
        self.count += 1

    @property
    def empty(self) -> bool:
        return self.count == 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def reduce(self, rank: int, flags: dict[str, bool]) -> tuple[dict[str, float], dict[str, bool]]:
        """Sum the window over all workers; the flags are rank 0's decisions, broadcast in the same call."""
        names = list(flags)
        own = [float(flags[n]) if rank == 0 else 0.0 for n in names]
        host = torch.tensor([float(self.samples), float(self.count), *own], dtype=torch.float64, device=self.device)
        buf = torch.cat([torch.stack([self.loss_sum, self.correct, self.grad_norm_sum]), host])
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world > 1:
            dist.all_reduce(buf)
        values = buf.tolist()
        loss_sum, correct, grad_norm_sum, samples, steps = values[:5]
        totals = {"loss_sum": loss_sum, "correct": correct, "samples": samples, "grad_norm_sum": grad_norm_sum, "steps": steps}
        totals["grad_norm_sum"] /= world  # every worker holds the same (global) norm
        totals["steps"] /= world
        self.warm, self._first = not self._first, False
        return totals, {n: v > 0 for n, v in zip(names, values[FIELDS:], strict=True)}


class Throughput:
    """Steady-state samples/s: the warm-up window of each attempt is left out."""

    def __init__(self) -> None:
        self.samples = self.seconds = self.all_samples = self.all_seconds = self.data_wait_s = 0.0

    def add(self, samples: float, seconds: float, warm: bool, data_wait_s: float = 0.0) -> None:
        self.all_samples += samples
        self.all_seconds += seconds
        self.data_wait_s += data_wait_s
        if warm:
            self.samples += samples
            self.seconds += seconds

    def rate(self) -> float:
        if self.seconds > 0:
            return self.samples / self.seconds
        return self.all_samples / self.all_seconds if self.all_seconds > 0 else 0.0


def interval_metrics(
    totals: dict[str, float], wall_s: float, data_wait_s: float, spec: DataSpec, flops_per_sample: float,
    device: torch.device, cfg: JobConfig,
) -> dict[str, float]:
    n = max(totals["samples"], 1.0)
    steps = max(totals["steps"], 1.0)
    out = {
        "train_loss": totals["loss_sum"] / n,
        "train_accuracy": totals["correct"] / (n * spec.tokens_per_sample),
        "grad_norm": totals["grad_norm_sum"] / steps,
        "samples_per_second": totals["samples"] / wall_s if wall_s > 0 else 0.0,
        "data_wait_share": data_wait_s / wall_s if wall_s > 0 else 0.0,
    }
    if spec.kind == "language_model":
        out["tokens_per_second"] = out["samples_per_second"] * spec.tokens_per_sample
    peak = peak_flops(device, cfg)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if peak:
        out["mfu"] = mfu(out["samples_per_second"] * flops_per_sample, peak * world)
    if device.type == "cuda":
        out["peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(device))
    return out


def eval_metrics(loss_sum: float, correct: float, n: float, spec: DataSpec) -> dict[str, float]:
    n = max(n, 1.0)
    out = {"val_loss": loss_sum / n, "val_accuracy": correct / (n * spec.tokens_per_sample)}
    if spec.kind == "language_model":
        out["val_perplexity"] = math.exp(min(out["val_loss"], 50.0))
    return out


def flops_per_sample(model: nn.Module, spec: DataSpec, cfg: JobConfig) -> float:
    """Training FLOPs per sample: 6 x parameters x tokens, plus attention for transformers.

    Attention (forward + backward) adds 12 x n_layer x d_model x seq_len per token (PaLM appendix B).
    """
    params = sum(p.numel() for p in model.parameters())
    tokens = spec.tokens_per_sample
    flops = 6.0 * params * tokens
    if cfg.model.name == "gpt":
        m = cfg.model
        flops += 12.0 * m.n_layer * m.d_model * m.seq_len * tokens
    return flops


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


def mfu(achieved_flops_per_s: float, peak_flops_per_s: float) -> float:
    """Model FLOPs utilisation: achieved / peak (both summed over the devices used)."""
    return achieved_flops_per_s / peak_flops_per_s if peak_flops_per_s > 0 else 0.0


def perf_summary(
    throughput: Throughput, spec: DataSpec, flops_per_sample: float, device: torch.device, cfg: JobConfig
) -> dict[str, Any]:
    rate = throughput.rate()
    out: dict[str, Any] = {
        "tokens_per_second": rate * spec.tokens_per_sample,
        "data_wait_share": throughput.data_wait_s / throughput.all_seconds if throughput.all_seconds else 0.0,
    }
    peak = peak_flops(device, cfg)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    out["mfu"] = mfu(rate * flops_per_sample, peak * world) if peak else None
    out["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return out
