"""The gpt workload without Ray: model, token data, the bf16/compile/checkpointing paths, FLOP and MFU
arithmetic, and bad input through the real CLI (exit code 2 naming the field)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from elastic_train.config import ConfigError, load
from elastic_train.data import DataSpec, build_data
from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import WorkerData
from elastic_train.models import build_model
from elastic_train.models.gpt import GPT, build_gpt
from elastic_train.train import metrics
from elastic_train.train.loop import (
    Precision,
    StepResult,
    loss_function,
    make_optimizer,
    make_scheduler,
    train_step,
)

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "configs" / "gpt-synthetic.yaml"
# The real preset, shrunk to seconds on one CPU.
SMALL = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.seq_len=16", "model.vocab_size=32",
         "data.num_samples=512", "train.global_batch_size=32", "train.warmup_steps=0", "train.schedule=constant"]


def cfg_for(*overrides: str):
    return load(PRESET, [*SMALL, *overrides])


def write_text(path: Path, n_bytes: int = 6000) -> Path:
    """A small generated text: repeated sentences (learnable), a few thousand bytes."""
    words = "the quick brown fox jumps over the lazy dog while elastic workers train".split()
    lines = [" ".join(words[(i * 3) % len(words):] + words[: (i * 3) % len(words)]) for i in range(n_bytes // 60 + 1)]
    path.write_text("\n".join(lines)[:n_bytes])
    return path


def train_losses(cfg, steps: int) -> list[float]:
    """Mean training loss per step of a single-process run of the engine's loop."""
    return run_steps(cfg, steps)[0]


def run_steps(cfg, steps: int, warmup: int = 0) -> tuple[list[float], float]:
    """``steps`` steps of the engine's loop in one process: per-step mean losses, and the share of the wall
    time after ``warmup`` steps spent in the data iterator (as the worker measures it)."""
    bundle = build_data(cfg)
    model = build_model(cfg, bundle.spec)
    if cfg.train.compile:
        model.compile()
    plan = BatchPlan(cfg.train.global_batch_size, 1, cfg.train.micro_batch_size)
    device = torch.device("cpu")
    data = WorkerData(bundle, plan, 0, cfg.seed, device, 0)
    opt = make_optimizer(model, cfg.train)
    sched = make_scheduler(opt, cfg.train, steps)
    precision = Precision.create(cfg.train.precision, device)
    loss_fn = loss_function(cfg.train.compile)
    losses: list[float] = []
    wait, start = 0.0, time.perf_counter()
    while len(losses) < steps:
        batches = data.epoch(len(losses) // data.steps_per_epoch)
        while len(losses) < steps:
            if len(losses) == warmup:
                wait, start = 0.0, time.perf_counter()
            t0 = time.perf_counter()
            item = next(batches, None)
            wait += time.perf_counter() - t0
            if item is None:
                break
            r = train_step(model, item[1], opt, sched, precision, plan.loss_scale, cfg.train.grad_clip, loss_fn=loss_fn)
            losses.append(r.loss_sum.item() / r.samples)
    return losses, wait / (time.perf_counter() - start)


# ------------------------------------------------------------------------------------------- model


@pytest.mark.slow  # seconds of CPU: make test, not the one-minute make test-fast
def test_gpt_shapes_causality_and_tied_head():
    model = build_gpt(cfg_for().model, DataSpec("language_model", (16,), 32, 16)).eval()
    x = torch.randint(0, 32, (3, 16))
    logits = model(x)
    assert logits.shape == (3, 16, 32)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 32  # change the future: earlier positions must not notice
    torch.testing.assert_close(model(x2)[:, :10], logits[:, :10])
    assert not torch.allclose(model(x2)[:, 10:], logits[:, 10:])
    assert model.head.weight is model.tok_emb.weight


def test_gpt2_small_has_124m_parameters_and_palm_flops():
    with torch.device("meta"):
        model = GPT(n_layer=12, n_head=12, d_model=768, seq_len=1024, vocab_size=50304)
    n = sum(p.numel() for p in model.parameters())
    assert 124e6 < n < 125e6  # GPT-2 small with the tied head
    n_matmul = n - 1024 * 768  # the position embedding is a lookup
    assert model.flops_per_token() == 6 * n_matmul + 12 * 12 * 768 * 1024
    assert model.flops_per_token(512) == 6 * n_matmul + 12 * 12 * 768 * 512


@pytest.mark.parametrize(
    "spec, field",
    [
        (DataSpec("classification", (64,), 10), "model.name"),
        (DataSpec("language_model", (32,), 32, 32), "model.seq_len"),
        (DataSpec("language_model", (16,), 300, 16), "model.vocab_size"),
    ],
)
def test_gpt_refuses_data_it_cannot_model(spec, field):
    with pytest.raises(ConfigError) as info:
        build_gpt(cfg_for().model, spec)
    assert info.value.field == field


def test_activation_checkpointing_gives_the_same_gradients():
    spec = DataSpec("language_model", (16,), 32, 16)
    grads = []
    for ac in (False, True):
        cfg = cfg_for(f"train.activation_checkpointing={str(ac).lower()}")
        model = build_model(cfg, spec)
        assert all(b.checkpointing is ac for b in model.blocks)
        x = torch.randint(0, 32, (4, 16), generator=torch.Generator().manual_seed(1))
        model(x).float().logsumexp(-1).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


# ------------------------------------------------------------------------------------------- data


def test_synthetic_tokens_are_seeded_shifted_and_learnable():
    cfg = cfg_for()
    a, b = build_data(cfg), build_data(cfg)
    assert torch.equal(a.train.x, b.train.x) and a.train.x.dtype == torch.int64
    assert a.train.x.shape == (512 - 51, 16) and len(a.val) == 51
    assert torch.equal(a.train.x[:, 1:], a.train.y[:, :-1])  # y is x shifted by one
    stride = (a.train.x[:, 1] - a.train.x[:, 0]) % 32
    assert torch.equal((a.train.x[:, 2] - a.train.x[:, 1]) % 32, stride)  # the pattern
    assert a.spec == DataSpec("language_model", (16,), 32, tokens_per_sample=16)
    assert not torch.equal(build_data(cfg_for("seed=1")).train.x, a.train.x)


def test_text_from_a_file_and_a_folder(tmp_path):
    f = write_text(tmp_path / "a.txt", 2000)
    cfg = cfg_for("data.name=text", f"data.path={f}", "model.vocab_size=256", "data.val_fraction=0.25")
    bundle = build_data(cfg)
    raw = torch.tensor(list(f.read_bytes()))
    assert bundle.train.x.shape == ((1500 - 1) // 16, 16) and bundle.val.x.shape == ((500 - 1) // 16, 16)
    torch.testing.assert_close(bundle.train.x.reshape(-1), raw[: bundle.train.x.numel()])
    torch.testing.assert_close(bundle.train.y.reshape(-1), raw[1 : bundle.train.x.numel() + 1])
    torch.testing.assert_close(bundle.val.x[0], raw[1500:1516])  # the tail is validation: no overlap
    assert bundle.info["files"] == 1 and bundle.info["tokens"] == 2000

    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    write_text(folder / "b.txt", 900)
    write_text(folder / "sub" / "c.txt", 1100)
    (folder / ".hidden").write_text("x" * 5000)  # dotfiles are skipped
    bundle = build_data(cfg_for("data.name=text", f"data.path={folder}", "model.vocab_size=256"))
    assert bundle.info["files"] == 2 and bundle.info["tokens"] == 2000


@pytest.mark.parametrize(
    "make, overrides, field, fragment",
    [
        (None, ["data.path=null"], "data.path", "needs a UTF-8 text file"),
        (None, ["data.path=/nonexistent/corpus.txt"], "data.path", "no such file"),
        ("empty_file", [], "data.path", "is empty"),
        ("empty_dir", [], "data.path", "holds no"),
        ("short", ["model.seq_len=64"], "model.seq_len", "longer than the validation text"),
        ("long", ["model.vocab_size=100"], "model.vocab_size", "at least 256"),
    ],
)
def test_text_bad_input_names_the_field(tmp_path, make, overrides, field, fragment):
    target = {"empty_file": tmp_path / "e.txt", "empty_dir": tmp_path / "d", "short": tmp_path / "s.txt",
              "long": tmp_path / "l.txt"}.get(make)
    if make == "empty_file":
        target.write_text("")
    elif make == "empty_dir":
        target.mkdir()
    elif make:
        write_text(target, 300 if make == "short" else 5000)
    path = [f"data.path={target}"] if target else []
    with pytest.raises(ConfigError) as info:
        build_data(cfg_for("data.name=text", "model.vocab_size=256", *path, *overrides))
    assert info.value.field == field and fragment in str(info.value)


# ------------------------------------------------------------------------------------------- training


@pytest.mark.slow  # seconds of CPU: make test, not the one-minute make test-fast
def test_loss_falls_on_synthetic_tokens():
    losses = train_losses(cfg_for(), 200)
    assert losses[0] > 3.0  # ~ln(32) at the start
    assert sum(losses[-5:]) / 5 < 0.4 * losses[0]  # measured: 3.48 -> 0.75


@pytest.mark.slow  # seconds of CPU: make test, not the one-minute make test-fast
def test_loss_falls_on_text(tmp_path):
    f = write_text(tmp_path / "t.txt", 8000)
    losses = train_losses(cfg_for("data.name=text", f"data.path={f}", "model.vocab_size=256"), 100)
    assert losses[0] > 4.5  # ~ln(256)
    assert sum(losses[-5:]) / 5 < 0.3 * losses[0]  # measured: 5.57 -> 0.70


def test_bf16_autocast_runs_on_cpu_and_learns():
    losses = train_losses(cfg_for("train.precision=bf16"), 20)
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]


@pytest.mark.slow  # 43 steps at the gpt preset's sizes, twice: ~5 s each, and a timing share a loaded box can miss
@pytest.mark.parametrize("data", ["synthetic_tokens", "text"])
def test_data_wait_share_stays_under_2_percent(tmp_path, data):
    """The gpt preset's own sizes, one process (no other threads to contend with): the time spent fetching
    the next batch is a small share of the step. (Measured here: 0.5-1.2%.)"""
    extra = ["data.name=text", f"data.path={write_text(tmp_path / 't.txt', 300_000)}"] if data == "text" else []
    _, share = run_steps(load(PRESET, extra), steps=43, warmup=3)
    assert share < 0.02


@pytest.mark.slow  # torch.compile: an inductor build (seconds, more on a cold cache)
def test_compile_path_matches_eager():
    eager = train_losses(cfg_for(), 3)
    compiled = train_losses(cfg_for("train.compile=true"), 3)
    assert compiled == pytest.approx(eager, rel=1e-4)


# ------------------------------------------------------------------------------------------- FLOPs and MFU


def test_flops_per_sample_for_a_known_model():
    spec = DataSpec("classification", (10,), 10)
    model = torch.nn.Linear(10, 10, bias=False)  # 100 parameters: 600 FLOPs per sample, fwd + bwd
    assert metrics.flops_per_sample(model, spec) == 600
    gpt_spec = DataSpec("language_model", (16,), 32, 16)
    gpt = build_gpt(cfg_for().model, gpt_spec)
    n = sum(p.numel() for p in gpt.parameters()) - 16 * 32
    assert metrics.flops_per_sample(gpt, gpt_spec) == 16 * (6 * n + 12 * 1 * 32 * 16)
    ddp_like = torch.nn.Module()
    ddp_like.module = gpt  # wrappers (DDP's .module, compile's _orig_mod) are looked through
    assert metrics.flops_per_sample(ddp_like, gpt_spec) == metrics.flops_per_sample(gpt, gpt_spec)


def test_mfu_counts_every_device():
    # 4 devices of 100 TFLOP/s peak, together achieving 120 TFLOP/s: 30% MFU.
    assert metrics.mfu(120e12, 100e12, devices=4) == pytest.approx(0.30)
    assert metrics.mfu(120e12, 0.0, devices=4) == 0.0


def test_interval_metrics_tokens_per_second_and_mfu():
    cfg = cfg_for("perf.peak_tflops=2.0")
    spec = DataSpec("language_model", (16,), 32, tokens_per_sample=16)
    totals = {
        "loss_sum": 64.0, "correct": 100.0, "samples": 320.0, "grad_norm_sum": 3.0, "grad_norms": 10, "steps": 10.0
    }
    flops = 1e9  # per sample
    out = metrics.interval_metrics(totals, 4.0, 0.04, spec, flops, torch.device("cpu"), cfg)
    assert out["samples_per_second"] == 80.0 and out["tokens_per_second"] == 80.0 * 16
    assert out["mfu"] == pytest.approx(80.0 * 1e9 / 2e12)  # one process, no process group: one device
    assert out["data_wait_share"] == pytest.approx(0.01)
    assert out["train_loss"] == 0.2 and out["grad_norm"] == 0.3
    text = metrics.speed_text(out)
    assert "1,280 tok/s" in text and "MFU 4.0%" in text and "data wait 1.0%" in text
    tp = metrics.Throughput()
    tp.add(320.0, 4.0, warm=False, data_wait_s=1.0)  # warm-up window (compile, first use): left out
    assert tp.rate() == 80.0 and tp.data_wait_share() == 0.25  # ... until there is a steady window
    tp.add(640.0, 4.0, warm=True, data_wait_s=0.2)
    summary = metrics.perf_summary(tp, spec, flops, torch.device("cpu"), cfg)
    assert summary["tokens_per_second"] == 160.0 * 16
    assert summary["mfu"] == pytest.approx(160.0 * 1e9 / 2e12)
    assert summary["data_wait_share"] == pytest.approx(0.05)
    assert metrics.perf_summary(tp, spec, flops, torch.device("cpu"), cfg_for())["mfu"] is None  # CPU: no table


def test_step_result_window_accepts_plain_tensors():
    w = metrics.Window(torch.device("cpu"))
    w.add(StepResult(torch.tensor(2.0), torch.tensor(3), 4, torch.tensor(0.5)))
    w.add(StepResult(torch.tensor(1.0), torch.tensor(1), 4, None))  # not a log step: no norm measured
    totals, _ = w.reduce(0, {})
    assert totals["samples"] == 8 and totals["grad_norm_sum"] == 0.5 and totals["grad_norms"] == 1


# ------------------------------------------------------------------------------------------- CLI exit 2


@pytest.mark.subprocess  # python -m jobs.train per case
@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.d_model=30", "model.n_head=4"], "model.d_model"),
        (["scaling.strategy=zero3"], "scaling.strategy"),
        (["data.name=text", "data.path=/nonexistent/corpus"], "data.path"),
        (["data.name=text", "data.path={empty}"], "data.path"),
        (["data.name=text", "data.path={short}", "model.seq_len=512"], "model.seq_len"),
    ],
)
def test_bad_gpt_input_exits_2_naming_the_field(tmp_path, overrides, field):
    (tmp_path / "empty.txt").write_text("")
    write_text(tmp_path / "short.txt", 1000)
    argv = [o.format(empty=tmp_path / "empty.txt", short=tmp_path / "short.txt") for o in overrides]
    env = {**os.environ, "ELASTIC_TRAIN_HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.train", "--config", str(PRESET), *argv],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"error: {field}=" in proc.stderr


# ------------------------------------------------------------------------------------------- bench/gpu.py


# What the GPU box has: torch, its own dependencies and numpy (no ray, mlflow, pydantic, PyYAML, sklearn).
TORCH_ALONE = ("torch", "torchgen", "functorch", "numpy", "sympy", "mpmath", "networkx", "jinja2", "markupsafe",
               "filelock", "typing_extensions", "fsspec", "setuptools")


def torch_alone(tmp_path: Path) -> dict[str, str]:
    """Env for ``python -S``: a sys.path holding links to those packages only."""
    site = Path(torch.__file__).resolve().parents[1]
    root = tmp_path / "torch-alone"
    root.mkdir()
    for entry in site.iterdir():
        if entry.name.split("-")[0].removesuffix(".py").removesuffix(".libs").lower() in TORCH_ALONE:
            (root / entry.name).symlink_to(entry)
    return {**os.environ, "PYTHONPATH": str(root)}


@pytest.mark.subprocess  # python -S bench/gpu.py
def test_bench_gpu_smoke_runs_with_torch_alone(tmp_path):
    """bench/gpu.py drives the engine where only torch and numpy are installed (the GPU box)."""
    env = torch_alone(tmp_path)
    for absent in ("ray", "mlflow", "pydantic", "yaml"):
        probe = subprocess.run([sys.executable, "-S", "-c", f"import {absent}"], env=env, capture_output=True)
        assert probe.returncode != 0, f"{absent} is importable: the check would prove nothing"
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-S", "bench/gpu.py", "--smoke", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "smoke" and result["device"] == "cpu"
    for key in ("engine", "plain", "ddp", "fsdp"):
        assert result[key]["tokens_per_second"] > 0 and 0 < result[key]["mfu"] < 1, key
    assert result["engine_vs_plain_mfu_ratio"] > 0 and result["fsdp_vs_ddp_step_time_ratio"] > 0
    assert result["engine"]["data_wait_share"] < 0.5


@pytest.mark.subprocess  # python -S bench/gpu_stream.py
def test_bench_gpu_stream_smoke_runs_with_torch_alone_and_checks_its_rows(tmp_path):
    """bench/gpu_stream.py drives StreamData (pinning, device copy, lookahead) where only torch and numpy are."""
    env = torch_alone(tmp_path)
    out = tmp_path / "stream.json"
    proc = subprocess.run([sys.executable, "-S", "bench/gpu_stream.py", "--smoke", "--rows", "600", "--epochs", "2",
                           "--global-batch", "64", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["checks"] == {
        "every_micro_batch_on_device": True, "every_id_once_per_epoch": True, "loss_finite": True}
    for side in ("in_memory", "stream", "stream_no_lookahead"):
        assert result[side]["samples_per_s"] > 0, side
