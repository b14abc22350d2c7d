"""FSDP through the real job: 2 gloo workers in Ray Train, the gpt preset shrunk to seconds.

FSDP and DDP train the same model on the same batches, so in fp32 their losses agree to float rounding
(measured: ~1e-7 relative); a sharded checkpoint written by 2 workers resumes on 1 and ends where an
uninterrupted 2-worker run ends.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs import train

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]
# configs/gpt-synthetic.yaml, shrunk: 18 steps per epoch of 32 sequences of 16 tokens, a 1-block model.
TINY_GPT = ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.seq_len=16", "model.vocab_size=32",
            "data.num_samples=640", "train.global_batch_size=32", "train.epochs=1", "train.warmup_steps=0",
            "train.schedule=constant", "tracking.system_metrics=false"]


def run(home: Path, name: str, *overrides: str) -> dict:
    summary = home / f"{name}.json"
    argv = ["--config", str(ROOT / "configs" / "gpt-synthetic.yaml"), *TINY_GPT, f"name={name}",
            f"checkpoint.storage_path={home}", *overrides, "--summary-json", str(summary)]
    assert train.main(argv) == 0
    out = json.loads(summary.read_text())
    assert out["status"] == "FINISHED" and "model_error" not in out, out.get("model_error")
    return out


def test_fsdp_matches_ddp(ray_session, home):
    ddp = run(home, "ddp", "perf.peak_tflops=1.0")
    fsdp = run(home, "fsdp", "scaling.strategy=fsdp", "perf.peak_tflops=1.0")
    for key in ("train_loss", "val_loss", "val_perplexity"):
        a, b = fsdp["final_metrics"][key], ddp["final_metrics"][key]
        print(f"fsdp vs ddp {key}: {a!r} vs {b!r}, relative difference {abs(a - b) / abs(b):.1e}")
        assert a == pytest.approx(b, rel=1e-5), key
    assert fsdp["final_metrics"]["val_loss"] < 3.0  # it learned: ln(32) = 3.47 at the start
    assert fsdp["params_sha256"] and fsdp["steps"] == ddp["steps"] == 18

    checkpoint = Path(fsdp["checkpoint"])
    assert (checkpoint / "dcp" / ".metadata").is_file() and not (checkpoint / "model.pt").exists()
    assert sorted(p.name for p in (checkpoint / "dcp").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert (Path(ddp["checkpoint"]) / "model.pt").is_file()

    for s in (ddp, fsdp):  # the speed figures reach the summary JSON
        assert s["tokens_per_second"] > 0 and 0 < s["mfu"] < 1
        # Rank 0's host time in the data iterator. On this shared 2-core CPU it is mostly GIL and scheduler
        # noise (measured 2-3%); the < 2% goal is checked in one process (tests/unit/test_gpt.py) and on GPUs.
        assert 0 <= s["data_wait_share"] < 0.25
        assert s["peak_memory_bytes"] is None  # CPU


def test_fsdp_checkpoint_from_2_workers_resumes_on_1(ray_session, home):
    run(home, "resized", "scaling.strategy=fsdp")  # epoch 1 on 2 workers, sharded checkpoint at its end
    resumed = run(home, "resized", "scaling.strategy=fsdp", "scaling.num_workers=1", "train.epochs=2")
    straight = run(home, "straight", "scaling.strategy=fsdp", "train.epochs=2")
    assert resumed["world_sizes"] == [2, 1] and resumed["steps"] == straight["steps"] == 36
    for key in ("train_loss", "val_loss"):  # model, optimizer moments and schedule all came back
        a, b = resumed["final_metrics"][key], straight["final_metrics"][key]
        print(f"2->1 workers vs 2 {key}: {a!r} vs {b!r}, relative difference {abs(a - b) / abs(b):.1e}")
        assert a == pytest.approx(b, rel=1e-5), key
    assert resumed["final_metrics"]["val_loss"] < 2.4  # still learning: 2.59 after one epoch
