"""What ASHA saves: an ASHA sweep against a grid over the same space, on digits. Prints JSON.

    .venv/bin/python bench/sweep_cost.py                 # 12 configs x 9 epochs, 3 sweeps (~12 min on 2 cores)
    .venv/bin/python bench/sweep_cost.py --smoke         # 4 configs x 3 epochs: the wiring, in ~4 minutes
    .venv/bin/python bench/sweep_cost.py --address auto  # on a running cluster (more trials at once)

Both sweeps run the real ``jobs.sweep`` over the same grid (``train.lr`` x ``train.global_batch_size``, each
trial a 2-worker DDP run): ``grid`` trains every config for ``--epochs``; ``asha`` runs the same configs with
ASHA (grace period 1 epoch, reduction factor ``--reduction-factor``) stopping the weak ones at its rungs. Training
is deterministic, so a config ASHA lets finish scores exactly what it scores in the grid.

* ``best_metric``: each sweep's best val_loss; ``metric_gap``: ASHA's best relative to the grid's (goal <= 1%).
* ``total_epochs``: epochs trained over all trials; ``epoch_share``: ASHA's over the grid's (goal <= 40%).

Asynchronous ASHA judges each trial against those that reached a rung before it, so with few trials at once
the order they start in matters. ``asha`` runs the grid with the learning rates in a seeded random order (what a
random search gives); ``asha_ascending`` in ascending order -- here the worst case: every trial beats the ones
before it at the first rungs, so few are stopped. The grid's cost does not depend on the order.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def space(lrs: list[float], batches: list[int]) -> str:
    values = "[" + ", ".join(f"{x:.6e}" for x in lrs) + "]"  # YAML reads 1e-05 as a string, 1.000000e-05 as a float
    return (f"sweep.space={{train.lr: {{type: grid, values: {values}}}, "
            f"train.global_batch_size: {{type: grid, values: {batches}}}}}")


def run(home: Path, name: str, args: argparse.Namespace, *overrides: str) -> dict:
    from jobs import sweep

    summary = home / f"{name}.json"
    argv = ["--config", str(ROOT / "configs/sweep-digits.yaml"), f"name={name}",
            f"checkpoint.storage_path={home / 'results'}", f"train.epochs={args.epochs}", "sweep.search=grid",
            "sweep.num_samples=1", space(args.lrs, args.batches), "tracking.experiment=bench-sweep-cost",
            f"sweep.max_concurrent_trials={args.concurrency}", *overrides, "--summary-json", str(summary)]
    started = time.time()
    with contextlib.redirect_stdout(sys.stderr):  # Tune's tables and the ranking to stderr; stdout is the JSON
        rc = sweep.main(argv)
    assert rc == 0, f"{name} sweep exited {rc}"
    s = json.loads(summary.read_text())
    return {
        "best_metric": s["best"]["metric"],
        "best_config": s["best"]["config"],
        "total_epochs": s["total_epochs"],
        "trials": len(s["trials"]),
        "trials_stopped_early": sum(t["status"] == "STOPPED" for t in s["trials"]),
        "max_concurrent_trials": s["max_concurrent_trials"],
        "placement_groups_reclaimed": s["placement_groups_reclaimed"],
        "wall_s": round(time.time() - started, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=9, help="every trial's budget (ASHA's max_t)")
    p.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")],
                   default=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2])
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    p.add_argument("--reduction-factor", type=float, default=3.0)
    p.add_argument("--concurrency", default="auto", help="sweep.max_concurrent_trials for both sweeps")
    p.add_argument("--address", help="a running Ray cluster; default: a private local Ray of --cpus CPUs")
    p.add_argument("--cpus", type=int, default=4, help="logical CPUs of the private local Ray")
    p.add_argument("--seed", type=int, default=0, help="seeds the learning rates' order in the asha sweep")
    p.add_argument("--smoke", action="store_true", help="4 configs x 3 epochs, no ascending-order sweep")
    args = p.parse_args()
    if args.smoke:
        args.epochs, args.lrs, args.batches = 3, [3e-4, 1e-2], [64, 256]
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    import ray

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        home = Path(tmp)
        os.environ["ELASTIC_TRAIN_HOME"] = str(home)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if args.address:
            ray.init(address=args.address, logging_level="ERROR")
        else:
            ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
        try:
            grid = run(home, "grid", args, "sweep.scheduler=none")
            asha_flags = (
                "sweep.scheduler=asha", "sweep.grace_period=1", f"sweep.reduction_factor={args.reduction_factor}"
            )
            shuffled = list(args.lrs)
            random.Random(args.seed).shuffle(shuffled)
            asha = run(home, "asha", argparse.Namespace(**{**vars(args), "lrs": shuffled}), *asha_flags)
            ascending = run(home, "asha-ascending", argparse.Namespace(**{**vars(args), "lrs": sorted(args.lrs)}),
                            *asha_flags) if not args.smoke else None
        finally:
            ray.shutdown()
    gap = (asha["best_metric"] - grid["best_metric"]) / abs(grid["best_metric"])  # val_loss: lower is better
    share = asha["total_epochs"] / grid["total_epochs"]
    if ascending:
        ascending["metric_gap"] = round((ascending["best_metric"] - grid["best_metric"]) / abs(grid["best_metric"]), 6)
        ascending["epoch_share"] = round(ascending["total_epochs"] / grid["total_epochs"], 4)
    out = {
        "workload": {"data": "digits", "workers_per_trial": 2, "epochs": args.epochs, "lrs": args.lrs,
                     "global_batch_sizes": args.batches, "reduction_factor": args.reduction_factor,
                     "asha_lr_order": shuffled,
                     "metric": "val_loss"},
        "grid": grid,
        "asha": asha,
        "asha_ascending": ascending,
        "metric_gap": round(gap, 6),
        "epoch_share": round(share, 4),
        "goal": {"metric_gap_max": 0.01, "epoch_share_max": 0.40, "met": gap <= 0.01 and share <= 0.40},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
