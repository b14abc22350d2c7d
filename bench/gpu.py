"""GPU benchmark: the engine's MFU against a plain PyTorch loop, and FSDP against DDP, on one GPU.

    python bench/gpu.py                  # ~124M gpt, seq 1024, bf16, torch.compile; one NVIDIA GPU, < 5 min
    python bench/gpu.py --smoke          # a tiny gpt on the CPU in seconds: the same code paths, no goals

Needs torch (and numpy) only: no Ray, no MLflow, no pydantic. The engine's data, model, batch plan, training
step, sharding and metric code runs under a plain ``torch.distributed`` group of one process (NCCL on a GPU,
gloo on the CPU); the config is a namespace with the engine's field names. Four timed runs of the same model
and the same batches, each after its own warm-up (compilation) steps:

    engine   what a Ray worker does at world size 1 (Ray skips DDP there): WorkerData -> train_step, with
             the engine's metric window reduced at its logging cadence
    plain    a hand-written loop: the batch tensors already on the GPU, autocast, backward, clip, step
    ddp      the engine with DistributedDataParallel forced on (as at world size > 1)
    fsdp     the engine with scaling.strategy=fsdp (FSDP2, per-block compile, bf16 policy)

Prints one JSON object (also written to ``--out``): each run's step time, tokens/s, MFU, data-wait share
and peak memory; ``engine_vs_plain_mfu_ratio`` (goal >= 0.98); ``fsdp_vs_ddp_step_time_ratio``. MFU uses
the built-in peak for A100/H100/H200 (bf16 dense) or ``--peak-tflops``. Goal on an H200: MFU >= 45%.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import socket
import sys
import time
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elastic_train.data import text
from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import WorkerData
from elastic_train.models import build_model
from elastic_train.train import metrics
from elastic_train.train.fsdp import shard_model
from elastic_train.train.loop import Precision, loss_function, make_optimizer, make_scheduler, train_step

SMOKE_PEAK_TFLOPS = 0.5  # a nominal CPU peak so the smoke run's MFU arithmetic is exercised end to end
GOALS = {"engine_vs_plain_mfu_ratio": 0.98, "mfu_h200": 0.45}
ENGINE_RUNS = {"engine": "none", "ddp": "ddp", "fsdp": "fsdp"}  # run name -> how the model is wrapped


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny model on the CPU (seconds); no goals")
    p.add_argument("--steps", type=int, help="timed optimizer steps per run (default 30; smoke 8)")
    p.add_argument("--warmup", type=int, help="untimed steps first, compilation included (default 8; smoke 2)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step (default 64; smoke 16)")
    p.add_argument("--micro-batch", type=int, help="sequences per forward pass (default 32; smoke 8)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (on by default, off in --smoke)")
    p.add_argument("--compile", action="store_true", help="torch.compile in --smoke too")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: built-in table)")
    p.add_argument("--runs", default="plain,engine,ddp,fsdp", help="which runs, comma-separated, in order")
    p.add_argument("--budget-s", type=float, default=270.0, help="skip the remaining runs past this wall time")
    p.add_argument("--out", help="also write the JSON here")
    return p.parse_args(argv)


def bench_config(a: argparse.Namespace, device: torch.device) -> NS:
    """The engine's config fields for this benchmark (a JobConfig without pydantic)."""
    smoke = a.smoke
    shape = dict(n_layer=2, n_head=2, d_model=64, seq_len=64, vocab_size=256) if smoke else \
        dict(n_layer=12, n_head=12, d_model=768, seq_len=1024, vocab_size=50304)
    steps = a.steps or (8 if smoke else 30)
    warmup = a.warmup if a.warmup is not None else (2 if smoke else 8)
    g = a.global_batch or (16 if smoke else 64)
    micro = a.micro_batch or (8 if smoke else 32)
    compile_ = (a.compile or not smoke) and not a.no_compile
    peak = a.peak_tflops or (SMOKE_PEAK_TFLOPS if smoke else None)
    val_fraction = 0.05
    return NS(
        seed=0, steps=steps, warmup=warmup, log_every=10,
        model=NS(name="gpt", dropout=0.0, **shape),
        data=NS(name="synthetic_tokens", num_samples=int((steps + warmup + 1) * g / (1 - val_fraction)) + 2,
                val_fraction=val_fraction, loader_workers=0),
        train=NS(global_batch_size=g, micro_batch_size=micro, lr=6e-4, optimizer="adamw", weight_decay=0.1,
                 momentum=0.9, betas=(0.9, 0.999), eps=1e-8, schedule="constant", warmup_steps=0,
                 min_lr_ratio=0.0, grad_clip=1.0,
                 precision="bf16", compile=compile_, activation_checkpointing=False),
        scaling=NS(strategy="ddp"),
        perf=NS(peak_tflops=peak),
    )


# --------------------------------------------------------------------------------------------- timing


class Timer:
    """Wall time of the timed steps, with the device drained at both ends."""

    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


def result(cfg: NS, device: torch.device, seconds: float, flops_per_sample: float, data_wait_s: float,
           loss: float) -> dict[str, Any]:
    steps, g, t = cfg.steps, cfg.train.global_batch_size, cfg.model.seq_len
    samples_per_s = steps * g / seconds
    peak = metrics.peak_flops(device, cfg)
    return {
        "step_time_s": seconds / steps,
        "tokens_per_second": samples_per_s * t,
        "mfu": metrics.mfu(samples_per_s * flops_per_sample, peak, metrics.world_size()) if peak else None,
        "data_wait_share": data_wait_s / seconds,
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "final_loss": loss,
    }


# --------------------------------------------------------------------------------------------- runs


def count_parameters(cfg: NS) -> int:
    from elastic_train.models.gpt import GPT

    m = cfg.model
    with torch.device("meta"):
        return sum(p.numel() for p in GPT(m.n_layer, m.n_head, m.d_model, m.seq_len, m.vocab_size).parameters())


def run_engine(cfg: NS, bundle: Any, device: torch.device, strategy: str) -> dict[str, Any]:
    """What ``worker.WorkerSession`` does per step, minus Ray: build, wrap (none | ddp | fsdp), then
    train_step and the metric window."""
    model = build_model(cfg, bundle.spec)  # seeded init, as on every worker
    if cfg.train.compile:
        model.compile()  # in place, as the worker does
    if strategy == "fsdp":
        model = shard_model(model, cfg, device)
    else:
        model.to(device)
        if strategy == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None
            )
    precision = Precision.create(cfg.train.precision, device, sharded=strategy == "fsdp")
    loss_fn = loss_function(cfg.train.compile)
    optimizer = make_optimizer(model, cfg.train)
    scheduler = make_scheduler(optimizer, cfg.train, cfg.steps + cfg.warmup)
    plan = BatchPlan(cfg.train.global_batch_size, 1, cfg.train.micro_batch_size)
    data = WorkerData(bundle, plan, 0, cfg.seed, device, 0)
    flops = metrics.flops_per_sample(model, bundle.spec, cfg)
    window, timer = metrics.Window(device), Timer(device)
    steps = data.epoch(0, 0)
    wait = loss = 0.0
    for i in range(cfg.warmup + cfg.steps):
        if i == cfg.warmup:
            start, wait = timer.sync(), 0.0
        t0 = time.perf_counter()
        _, micro = next(steps)
        wait += time.perf_counter() - t0
        window.add(train_step(model, micro, optimizer, scheduler, precision, plan.loss_scale, cfg.train.grad_clip,
                              loss_fn=loss_fn))
        if (i + 1) % cfg.log_every == 0:  # the worker's log cadence: one small reduce + host sync
            totals, _ = window.reduce(0, {})
            metrics.interval_metrics(totals, window.elapsed(), wait, bundle.spec, flops, device, cfg)
            loss = totals["loss_sum"] / max(totals["samples"], 1.0)
            window.reset()
    seconds = timer.sync() - start
    if not window.empty:
        totals, _ = window.reduce(0, {})
        loss = totals["loss_sum"] / max(totals["samples"], 1.0)
    return result(cfg, device, seconds, flops, wait, loss)


def run_plain(cfg: NS, bundle: Any, device: torch.device) -> dict[str, Any]:
    """The same model, hyperparameters and batches as a short hand-written loop (nanoGPT style)."""
    from elastic_train.models.gpt import GPT

    m, t = cfg.model, cfg.train
    torch.manual_seed(cfg.seed)
    model = GPT(m.n_layer, m.n_head, m.d_model, m.seq_len, m.vocab_size, m.dropout).to(device)
    step_model = torch.compile(model) if t.compile else model

    def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1))

    loss_of = torch.compile(cross_entropy) if t.compile else cross_entropy  # fused, as nanoGPT's in-model loss
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.lr, fused=device.type == "cuda" or None,
    )
    x_all, y_all = bundle.train.x.to(device), bundle.train.y.to(device)
    g, micro = t.global_batch_size, t.micro_batch_size
    accum = -(-g // micro)
    order = torch.randperm(len(x_all), generator=torch.Generator().manual_seed(cfg.seed)).to(device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if t.precision == "bf16" else contextlib.nullcontext()
    timer = Timer(device)
    loss_sum = torch.zeros((), device=device)
    for i in range(cfg.warmup + cfg.steps):
        if i == cfg.warmup:
            start = timer.sync()
            loss_sum.zero_()
        batch = order[i * g : (i + 1) * g]
        for j in range(accum):
            idx = batch[j * micro : (j + 1) * micro]
            x, y = x_all[idx], y_all[idx]
            with autocast:
                logits = step_model(x)
            loss = loss_of(logits, y)
            (loss / accum).backward()
            loss_sum += loss.detach() / accum
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seconds = timer.sync() - start
    flops = model.flops_per_token(m.seq_len) * m.seq_len
    return result(cfg, device, seconds, flops, 0.0, loss_sum.item() / cfg.steps)


# --------------------------------------------------------------------------------------------- main


def init_process_group(device: torch.device) -> None:
    """A one-process group, as Ray Train would set up (NCCL on a GPU, gloo on the CPU)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1, **kwargs)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    if not a.smoke and not torch.cuda.is_available():
        print("error: no CUDA device; run with --smoke on a CPU", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if not a.smoke else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # as the worker does on GPUs
        torch.backends.cudnn.allow_tf32 = True
    cfg = bench_config(a, device)
    init_process_group(device)
    bundle = text.build_synthetic_tokens(cfg)
    out: dict[str, Any] = {
        "mode": "smoke" if a.smoke else "full",
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": {k: getattr(cfg.model, k) for k in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size")},
        "precision": cfg.train.precision, "compile": cfg.train.compile,
        "global_batch": cfg.train.global_batch_size, "micro_batch": cfg.train.micro_batch_size,
        "parameters": count_parameters(cfg),
        "steps": cfg.steps, "warmup_steps": cfg.warmup,
        "peak_tflops": (metrics.peak_flops(device, cfg) or 0) / 1e12 or None,
    }
    for name in a.runs.split(","):
        if time.perf_counter() - t_start > a.budget_s:
            out[name] = {"skipped": f"over --budget-s {a.budget_s:g}"}
            continue
        t0 = time.perf_counter()
        out[name] = (
            run_plain(cfg, bundle, device) if name == "plain" else run_engine(cfg, bundle, device, ENGINE_RUNS[name])
        )
        out[name]["run_wall_s"] = time.perf_counter() - t0
        print(f"{name}: {json.dumps(out[name])}", file=sys.stderr, flush=True)
        free(device)
    out.update(ratios(out))
    out["goals"] = GOALS
    out["wall_s"] = time.perf_counter() - t_start
    dist.destroy_process_group()
    text_out = json.dumps(out, indent=2)
    print(text_out)
    if a.out:
        Path(a.out).write_text(text_out + "\n")
    return 0


def ratios(out: dict[str, Any]) -> dict[str, float | None]:
    def get(run: str, key: str) -> float | None:
        return (out.get(run) or {}).get(key)

    eng, plain = get("engine", "mfu"), get("plain", "mfu")
    if eng is None or plain is None:  # no peak known: the same ratio from throughput
        eng, plain = get("engine", "tokens_per_second"), get("plain", "tokens_per_second")
    ddp, fsdp = get("ddp", "step_time_s"), get("fsdp", "step_time_s")
    return {
        "engine_mfu": get("engine", "mfu"),
        "engine_tokens_per_second": get("engine", "tokens_per_second"),
        "engine_vs_plain_mfu_ratio": eng / plain if eng and plain else None,
        "fsdp_vs_ddp_step_time_ratio": fsdp / ddp if fsdp and ddp else None,
    }


if __name__ == "__main__":
    sys.exit(main())
