"""FSDP through the real job: 2 gloo workers in Ray Train, the gpt preset shrunk to seconds.

One uninterrupted 2-worker FSDP run is the reference. DDP on the same batches reaches the same losses in
fp32 (measured here: equal to the last digit); a sharded checkpoint written by 2 workers resumes on 1 and
ends where the reference ends (measured: 2.5e-8 relative); a worker killed mid-run ends bitwise equal.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs import train

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
# configs/gpt-synthetic.yaml shrunk: a 1-block model, 18 steps per epoch of 32 sequences of 16 tokens, and a
# validation set of 65 (shards of 32 and 33: FSDP's ranks must still run the same number of forwards).
TINY_GPT = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.seq_len=16", "model.vocab_size=32",
            "data.num_samples=650", "train.global_batch_size=32", "train.warmup_steps=0", "train.schedule=constant",
            "train.epochs=2", "checkpoint.every_steps=6", "perf.peak_tflops=1.0", "tracking.system_metrics=false"]
FSDP = "scaling.strategy=fsdp"


def run(tmp: Path, name: str, *overrides: str) -> dict:
    summary = tmp / f"{name}.json"
    argv = ["--config", str(ROOT / "configs" / "gpt-synthetic.yaml"), *TINY_GPT, f"name={name}",
            f"checkpoint.storage_path={tmp}", *overrides, "--summary-json", str(summary)]
    assert train.main(argv) == 0
    out = json.loads(summary.read_text())
    assert out["status"] == "FINISHED" and "model_error" not in out, out.get("model_error")
    return out


def close(a: float, b: float, what: str) -> bool:
    print(f"{what}: {a!r} vs {b!r}, relative difference {abs(a - b) / abs(b):.1e}")
    return a == pytest.approx(b, rel=1e-5)


@pytest.fixture(scope="module")
def reference(ray_module, session_home, tmp_path_factory):
    """The uninterrupted 2-worker FSDP run (shared: each run costs ~20 s here)."""
    os.environ["ELASTIC_TRAIN_HOME"] = str(session_home)
    tmp = tmp_path_factory.mktemp("fsdp")
    return tmp, run(tmp, "fsdp", FSDP)


def test_fsdp_trains_shards_its_checkpoints_and_reports_speed(reference):
    tmp, fsdp = reference
    assert fsdp["world_sizes"] == [2] and fsdp["steps"] == 36
    assert fsdp["final_metrics"]["val_loss"] < 2.4  # ln(32) = 3.47 at the start
    checkpoint = Path(fsdp["checkpoint"])
    assert (checkpoint / "dcp" / ".metadata").is_file() and not (checkpoint / "model.pt").exists()
    assert sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert fsdp["tokens_per_second"] > 0 and 0 < fsdp["mfu"] < 1 and fsdp["peak_memory_bytes"] is None  # CPU
    # Rank 0's host time in the data iterator. On this shared 2-core CPU it is mostly GIL and scheduler
    # noise (measured 2-3%); the < 2% goal is checked in one process (tests/unit/test_gpt.py) and on GPUs.
    assert 0 <= fsdp["data_wait_share"] < 0.25


def test_fsdp_matches_ddp(reference):
    tmp, fsdp = reference
    ddp = run(tmp, "ddp")
    assert (Path(ddp["checkpoint"]) / "model.pt").is_file()
    for key in ("train_loss", "val_loss", "val_perplexity"):
        assert close(fsdp["final_metrics"][key], ddp["final_metrics"][key], f"fsdp vs ddp {key}"), key


@pytest.mark.long  # `make test-long`; make test keeps FSDP's crash-and-resume at the same world size
def test_fsdp_checkpoint_from_2_workers_resumes_on_1(reference):
    tmp, fsdp = reference
    run(tmp, "resized", FSDP, "train.epochs=1")  # one epoch on 2 workers, then a sharded checkpoint
    resized = run(tmp, "resized", FSDP, "scaling.num_workers=1")
    assert resized["world_sizes"] == [2, 1] and resized["steps"] == 36
    for key in ("train_loss", "val_loss"):  # model, optimizer moments and schedule all came back
        assert close(resized["final_metrics"][key], fsdp["final_metrics"][key], f"2->1 vs 2 workers {key}"), key


def test_fsdp_crash_mid_run_ends_bitwise_equal(reference, monkeypatch):
    tmp, fsdp = reference
    marker = tmp / "fault-fired"
    monkeypatch.setenv("ELASTIC_TRAIN_FAULT", f"step=15,rank=1,marker={marker},mode=exit")
    crashed = run(tmp, "fsdp-crashed", FSDP)
    assert marker.exists(), "the fault never fired"
    assert crashed["restarts"] == 1 and crashed["world_sizes"] == [2]
    assert crashed["params_sha256"] == fsdp["params_sha256"]
