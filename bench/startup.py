"""Startup and whole-process wall: the engine's one-epoch digits run vs bare Ray Train doing the same work. JSON.

    .venv/bin/python bench/startup.py              # 3 alternated pairs (~5 minutes on an idle 2-core box)
    .venv/bin/python bench/startup.py --pairs 1    # smoke: one pair

Each side is a fresh process with a fresh embedded Ray (``RAY_ADDRESS=local``), a fresh storage path and, for the
engine, a fresh MLflow store: what a new user sees. The engine is

    python -m jobs.train --config configs/digits.yaml train.epochs=1 scaling.num_workers=1

and the baseline is bench/bare_digits.py (the same data, model, optimizer, batch and epoch, one checkpoint, no
tracking). The two alternate (engine first in even pairs, bare first in odd ones); figures are medians over pairs.

    wall_ratio                engine / bare, process launch to exit          goal <= 1.10
    time_to_first_step_ratio  engine / bare, launch to the first step done   goal <= 1.10

The engine's startup and teardown breakdowns (from its run summary) are reported per pair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 900


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_")) and k != "ELASTIC_TRAIN_HOME"}
    env.update(RAY_ADDRESS="local", ELASTIC_TRAIN_HOME=str(home), PYTHONPATH=str(ROOT))
    return env


def _run(argv: list[str], home: Path) -> tuple[float, float, str]:
    """(launch unix time, wall seconds, stdout) of one process."""
    t0 = time.time()
    proc = subprocess.run(argv, cwd=ROOT, env=_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=TIMEOUT_S)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{argv[1:3]} failed with exit code {proc.returncode}:\n{proc.stdout[-4000:]}")
    return t0, wall, proc.stdout


def engine(tmp: Path) -> dict:
    summary = tmp / "summary.json"
    argv = [sys.executable, "-m", "jobs.train", "--config", "configs/digits.yaml", "train.epochs=1",
            "scaling.num_workers=1", "name=startup-bench", f"checkpoint.storage_path={tmp / 'ckpt'}",
            "--summary-json", str(summary)]
    t0, wall, _ = _run(argv, tmp)
    s = json.loads(summary.read_text())
    return {"wall_s": wall, "time_to_first_step_s": s["first_step_unix"] - t0, "summary_wall_s": s["wall_s"],
            "startup": s["startup"], "teardown": s["teardown"], "goodput_ratio": s["goodput"]["goodput_ratio"]}


def bare(tmp: Path) -> dict:
    argv = [sys.executable, str(ROOT / "bench" / "bare_digits.py"), "--epochs", "1", "--workers", "1",
            "--storage", str(tmp / "ckpt")]
    t0, wall, out = _run(argv, tmp)
    first = next(float(line.split("FIRST_STEP ")[1].split()[0]) for line in out.splitlines() if "FIRST_STEP " in line)
    return {"wall_s": wall, "time_to_first_step_s": first - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="alternated engine/bare pairs (1: smoke)")
    args = parser.parse_args()
    pairs = []
    for i in range(args.pairs):
        order = [("engine", engine), ("bare", bare)] if i % 2 == 0 else [("bare", bare), ("engine", engine)]
        pair = {}
        for name, fn in order:
            with tempfile.TemporaryDirectory(prefix=f"startup-{name}-") as tmp:
                pair[name] = fn(Path(tmp))
        pairs.append(pair)
        print(json.dumps({"pair": i, **pair}), file=sys.stderr, flush=True)

    def med(side: str, key: str) -> float:
        return statistics.median(p[side][key] for p in pairs)

    out = {
        "pairs": args.pairs,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "engine_wall_s": med("engine", "wall_s"),
        "bare_wall_s": med("bare", "wall_s"),
        "engine_time_to_first_step_s": med("engine", "time_to_first_step_s"),
        "bare_time_to_first_step_s": med("bare", "time_to_first_step_s"),
    }
    out["wall_ratio"] = out["engine_wall_s"] / out["bare_wall_s"]
    out["time_to_first_step_ratio"] = out["engine_time_to_first_step_s"] / out["bare_time_to_first_step_s"]
    out["goal"] = {"wall_ratio": 1.10, "time_to_first_step_ratio": 1.10}
    out["runs"] = pairs
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
