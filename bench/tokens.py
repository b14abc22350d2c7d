"""Token data: prepare_tokens throughput and peak memory, and the shard reader against in-memory windows. JSON.

    .venv/bin/python bench/tokens.py --smoke      # < 1 min: a ~3 MB corpus
    .venv/bin/python bench/tokens.py              # a ~24 MB corpus (Python's own standard library, repeated)

The corpus is real text: the standard library's .py files. Both loader sides serve the same windows in the same
order through the engine's WorkerData (one worker, one torch thread, CPU, global batch 64 x seq_len 256):
``memmap`` (the key's old name) reads each micro-batch's windows from the shards (one ``preadv`` a window);
``in_memory`` holds every window as one int64 tensor (the ``text`` path).
Sides alternate, 3 rounds each, medians reported.

    loader_ratio       memmap / in-memory tokens/s          goal: within noise of 1 (>= 0.9 on a loaded box)
    prepare_tokens_s   tokenizer throughput on the pool      (2 workers)
    peak_rss_ratio     prepare's peak RSS, corpus x4 / x1   goal: ~1 (memory flat in the corpus size)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_corpus(out: Path, megabytes: float, copies: int = 1) -> Path:
    """The standard library's sources until ``megabytes``, the whole repeated ``copies`` times (one file)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for f in sorted(lib.rglob("*.py")):
        if "test" in f.parts or "site-packages" in f.parts:
            continue
        text = f.read_text(errors="replace")
        parts.append(text)
        size += len(text)
        if size >= megabytes * 1e6:
            break
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"corpus-x{copies}.txt"
    with open(path, "w") as fh:
        for _ in range(copies):
            fh.write("\n\n".join(parts))
            fh.write("\n\n")
    return path


PREPARE = """
import json, resource, sys, time
from elastic_train.data.prepare import PrepareSettings, prepare
t = time.perf_counter()
index = prepare([sys.argv[1]], sys.argv[2], PrepareSettings(tokenizer=sys.argv[3], val_fraction=0.01), workers=2)
wall = time.perf_counter() - t
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"tokens": index["train"]["tokens"] + index["val"]["tokens"], "wall_s": wall, "peak_rss_kb": peak}))
"""


def run_prepare(corpus: Path, out: Path, tokenizer: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", PREPARE, str(corpus), str(out), tokenizer], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def loader_rate(bundle, seq_len: int, epochs: int = 1) -> float:
    import torch

    from elastic_train.data.batching import BatchPlan
    from elastic_train.data.loader import WorkerData

    data = WorkerData(bundle, BatchPlan(64, 1, 16), 0, seed=0, device=torch.device("cpu"))
    t0, tokens = time.perf_counter(), 0
    for epoch in range(epochs):
        for _, micro in data.epoch(epoch):
            for x, y in micro:
                tokens += x.numel()
                _ = int(x[0, 0]) + int(y[-1, -1])  # touch the batch
    return tokens / (time.perf_counter() - t0)


def in_memory_copy(bundle):
    """The same windows, held as one tensor (what data.name=text does)."""
    from elastic_train.data.spec import DataBundle, TensorSet

    x, y = bundle.train.gather(list(range(len(bundle.train))))
    return DataBundle(TensorSet(x.clone(), y.clone()), bundle.val, bundle.spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a ~3 MB corpus, < 1 min")
    ap.add_argument("--tokenizer", default="bytes", help="bytes (default: the loader, not BPE training) | bpe")
    args = ap.parse_args()
    mb = 1.5 if args.smoke else 12.0
    import torch

    torch.set_num_threads(1)  # as in a Ray worker with 1 CPU (a multi-threaded gather spins on a busy box)
    from elastic_train.config import load
    from elastic_train.data import build_data

    with tempfile.TemporaryDirectory() as tmp:
        tmp_p = Path(tmp)
        one, four = make_corpus(tmp_p, mb, 1), make_corpus(tmp_p, mb, 4)
        p1 = run_prepare(one, tmp_p / "shards1", args.tokenizer)
        p4 = run_prepare(four, tmp_p / "shards4", args.tokenizer)
        cfg = load(None, ["model.name=gpt", "data.name=tokens", f"data.path={tmp_p / 'shards4'}",
                          "model.seq_len=256", "model.vocab_size=65536", "train.global_batch_size=64"])
        mm = build_data(cfg)
        mem = in_memory_copy(mm)
        rates: dict[str, list[float]] = {"memmap": [], "in_memory": []}
        for _ in range(3):
            for side, bundle in (("memmap", mm), ("in_memory", mem)):
                rates[side].append(loader_rate(bundle, 256))
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(json.dumps({
            "smoke": args.smoke, "corpus_mb_x1": round(one.stat().st_size / 1e6, 2),
            "corpus_mb_x4": round(four.stat().st_size / 1e6, 2), "tokenizer": args.tokenizer,
            "prepare_tokens_per_s_x1": round(p1["tokens"] / p1["wall_s"]),
            "prepare_tokens_per_s_x4": round(p4["tokens"] / p4["wall_s"]),
            "prepare_peak_rss_mb_x1": round(p1["peak_rss_kb"] / 1024, 1),
            "prepare_peak_rss_mb_x4": round(p4["peak_rss_kb"] / 1024, 1),
            "peak_rss_ratio": round(p4["peak_rss_kb"] / p1["peak_rss_kb"], 3),
            "train_windows": len(mm.train), "seq_len": 256,
            "memmap_tokens_per_s": round(med["memmap"]), "in_memory_tokens_per_s": round(med["in_memory"]),
            "loader_ratio": round(med["memmap"] / med["in_memory"], 3),
            "rounds": {k: [round(r) for r in v] for k, v in rates.items()},
            "self_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }, indent=1))


if __name__ == "__main__":
    main()
