"""A token corpus larger than the memory limit of the process that trains on it.

The limit is RLIMIT_AS (the whole virtual address space, which any user can lower for its own processes; a cgroup
would need root or a systemd user manager). It counts every mapping, file-backed ones too, so it is strict: a
reader that maps the corpus (``np.memmap``) cannot even open it, and one that keeps growing buffers fails. The
child process imports torch, builds the engine's own loop (WorkerData + a tiny GPT + train_step, as a Ray worker
runs it at world size 1, and as bench/gpu.py drives it), then caps its address space at what it has mapped so far
plus ``HEADROOM``, checks the cap bites (mapping the corpus fails), and trains on windows drawn from the whole
corpus, which is larger than the cap itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from elastic_train.data.prepare import INDEX, PrepareSettings, prepare

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]

ROOT = Path(__file__).resolve().parents[2]
SHARD_BYTES = 256 << 20
HEADROOM = 160 << 20

CHILD = r"""
import json, os, resource, sys
import numpy as np, torch
torch.set_num_threads(1)
from elastic_train.config import load
from elastic_train.data import build_data
from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import WorkerData
from elastic_train.models import build_model
from elastic_train.train.loop import Precision, loss_function, make_optimizer, make_scheduler, train_step

def status(key):
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) * 1024

shards, headroom, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = load(None, ["model.name=gpt", "data.name=tokens", f"data.path={shards}", "model.vocab_size=256",
                  "model.seq_len=256", "model.n_layer=2", "model.d_model=32", "model.n_head=2",
                  "train.global_batch_size=16", "train.lr=3e-3", "data.val_tokens=4096"])
bundle = build_data(cfg)
model = build_model(cfg, bundle.spec)
optimizer = make_optimizer(model, cfg.train)
scheduler = make_scheduler(optimizer, cfg.train, steps)
plan = BatchPlan(16, 1, 16)
data = WorkerData(bundle, plan, 0, 0, torch.device("cpu"), 0)
precision, loss_fn = Precision.create("fp32", torch.device("cpu")), loss_function(False)
it = data.epoch(0, 0)
losses = []
def step(micro):
    losses.append(float(train_step(model, micro, optimizer, scheduler, precision, plan.loss_scale, 1.0,
                                   loss_fn=loss_fn).loss_sum) / 16)  # a sum over the micro-batch
step(next(it)[1])  # warm-up: the epoch's permutation (the sampler's), optimizer state, torch's lazily paged code
limit = status("VmSize") + headroom
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
files = [f for f in bundle.train.files]
try:  # the control: the cap bites, a reader that maps the corpus cannot open it
    maps = [np.memmap(f, dtype=np.uint16, mode="r") for f in files]
    mapped = True
except (OSError, ValueError, MemoryError):
    mapped = False
    maps = []
del maps
rss0 = status("VmRSS")
seen = set()
for i in range(1, steps):
    _, micro = next(it)
    seen.update(int(s) for s in np.searchsorted(bundle.train.first, data.sampler.global_batch(0, i).numpy(),
                                               side="right") - 1)
    step(micro)
print(json.dumps({"limit": limit, "vm_size": status("VmSize"), "rss_growth": status("VmRSS") - rss0, "rss0": rss0,
                  "hwm": status("VmHWM"), "corpus_bytes": sum(os.path.getsize(f) for f in files),
                  "mapped": mapped, "shards_touched": len(seen), "shards": len(files), "losses": losses}))
"""


def big_shards(tmp: Path, n_shards: int) -> Path:
    """A real shard folder (bytes tokenizer) whose train split is ``n_shards`` files of SHARD_BYTES, written in
    32 MB chunks (the test process never holds the corpus either): a learnable stream, each token the previous
    one plus one (mod 97), so the loss can show the model trained on what it read."""
    (tmp / "corpus.txt").write_text("\n\n".join(f"document {i} of a small seed corpus." for i in range(400)))
    out = tmp / "shards"
    index = prepare([str(tmp / "corpus.txt")], str(out), PrepareSettings(tokenizer="bytes", val_fraction=0.1),
                    workers=1)
    block = (np.arange((32 << 20) // 2) % 97 + 1).astype(np.uint16)
    shards = []
    for k in range(n_shards):
        name = f"train_big_{k:03d}.bin"
        with open(out / name, "wb") as fh:
            for j in range(SHARD_BYTES // block.nbytes):
                np.roll(block, k * 7919 + j * 13).tofile(fh)
        shards.append({"file": name, "tokens": SHARD_BYTES // 2, "documents": 0})
    index["train"] = {"shards": shards, "tokens": n_shards * SHARD_BYTES // 2, "documents": index["train"]["documents"]}
    (out / INDEX).write_text(json.dumps(index))
    return out


def test_a_corpus_larger_than_the_training_process_address_space_limit_trains(tmp_path):
    out = big_shards(tmp_path, n_shards=4)
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "1"}
        res = subprocess.run([sys.executable, "-c", CHILD, str(out), str(HEADROOM), "30"], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=240)
    finally:
        for f in out.glob("train_big_*.bin"):
            f.unlink()  # a GB in pytest's kept tmp dirs would outlive the test
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["corpus_bytes"] > r["limit"], r  # the corpus does not fit in the process's whole address space
    assert not r["mapped"], "the limit does not bite: mapping the corpus succeeded"
    # the reader's memory is one micro-batch: nothing of the corpus stays resident (np.memmap windows grew the
    # resident set by ~620 MB over the same 29 steps, file pages faulted in around every window)
    assert r["vm_size"] <= r["limit"] and r["rss_growth"] < 64 << 20, r
    assert r["shards_touched"] == r["shards"], r  # the windows came from all over the corpus
    losses = r["losses"]
    assert all(np.isfinite(losses)) and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
