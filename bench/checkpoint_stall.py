"""Checkpoint stall: how long training waits per checkpoint with checkpoints on ``s3://`` against a local path.
JSON. Goal (issue 12): the s3:// stall no more than 1.5x the local one (the upload is asynchronous).

    .venv/bin/python bench/checkpoint_stall.py --smoke     # ~3 minutes on 2 loaded cores
    .venv/bin/python bench/checkpoint_stall.py             # more checkpoints and repeats

The same run on both sides: ``jobs.train`` on the digits preset with a wider MLP (``--hidden``; the checkpoint
is a few MB), 1 worker, tracking off, a checkpoint every ``--every`` steps, against one local Ray. The S3 side
is a real S3 API on 127.0.0.1 (``moto_server``, tests/helpers/s3.py). The stall is the run's goodput
``checkpoint_s`` (the time the training loop was blocked by checkpoints, validation excluded: save, report,
the upload hand-off) divided by its checkpoints; sides alternate, repeated; medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(home: Path, storage: str, args: argparse.Namespace) -> dict[str, float]:
    name = f"stall-{uuid.uuid4().hex[:8]}"
    summary = home / f"{name}.json"
    with contextlib.redirect_stdout(sys.stderr):  # the job's console: stdout is this benchmark's JSON
        rc = _train(name, storage, summary, args)
    if rc != 0:
        raise SystemExit(f"run on {storage} failed with exit code {rc}")
    s = json.loads(summary.read_text())
    steps = int(s["steps"])
    checkpoints = steps // args.every + args.epochs  # every N steps, plus each epoch's end (the same both sides)
    return {"checkpoint_s": s["goodput"]["checkpoint_s"], "checkpoints": checkpoints,
            "stall_s": s["goodput"]["checkpoint_s"] / checkpoints, "wall_s": s["wall_s"]}


def _train(name: str, storage: str, summary: Path, args: argparse.Namespace) -> int:
    from jobs import train

    return train.main(["--config", str(ROOT / "configs/digits.yaml"), f"name={name}",
                       f"checkpoint.storage_path={storage}", f"checkpoint.every_steps={args.every}",
                       "checkpoint.every_seconds=null", f"train.epochs={args.epochs}", "tracking.enabled=false",
                       f"model.hidden_sizes=[{args.hidden},{args.hidden}]", "scaling.num_workers=1",
                       "--summary-json", str(summary)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="1 epoch, 2 repeats")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    if args.smoke:
        args.epochs, args.repeats = 1, 2
    import ray

    from tests.helpers.s3 import start_s3_server

    server = start_s3_server()
    try:
        os.environ.update(server.env())
        bucket = f"stall-{uuid.uuid4().hex[:8]}"
        server.client().create_bucket(Bucket=bucket)
        with tempfile.TemporaryDirectory(prefix="et-bench-") as tmp:
            home = Path(tmp)
            os.environ["ELASTIC_TRAIN_HOME"] = str(home)
            ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
            sides: dict[str, list[dict[str, float]]] = {"local": [], "s3": []}
            for i in range(args.repeats):  # alternating, the first side swapped every repeat
                order = ["local", "s3"] if i % 2 == 0 else ["s3", "local"]
                for side in order:
                    storage = str(home / "results") if side == "local" else f"s3://{bucket}/runs"
                    sides[side].append(run(home, storage, args))
            ray.shutdown()
    finally:
        server.stop()
    med = {side: statistics.median(r["stall_s"] for r in runs) for side, runs in sides.items()}
    out = {
        "benchmark": "checkpoint_stall",
        "task": f"digits, MLP 64-{args.hidden}-{args.hidden}-10, 1 worker, {args.epochs} epoch(s), "
                f"a checkpoint every {args.every} steps, tracking off",
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "statistic": "median over runs of goodput checkpoint_s / checkpoints; sides alternate",
        "local_stall_s": round(med["local"], 4),
        "s3_stall_s": round(med["s3"], 4),
        "ratio_s3_to_local": round(med["s3"] / med["local"], 3) if med["local"] else None,
        "goal": "ratio <= 1.5",
        "runs": {side: [{k: round(v, 4) for k, v in r.items()} for r in runs] for side, runs in sides.items()},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
