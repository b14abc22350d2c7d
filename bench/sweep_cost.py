"""What a sweep costs: ASHA against a grid over the same space, and ``jobs.sweep`` against bare Tune + Train V2
doing the same trials (the anchor), on digits. Prints JSON.

    .venv/bin/python bench/sweep_cost.py                 # 12 configs x 9 epochs, 3 sweeps + the anchor (~16 min)
    .venv/bin/python bench/sweep_cost.py --smoke         # the anchor only: 2 trials x 1 epoch per side (< 3 min)
    .venv/bin/python bench/sweep_cost.py --per-trial     # the anchor only: 6 trials x 2 epochs, 2 rounds (~10 min)
    .venv/bin/python bench/sweep_cost.py --address auto  # on a running cluster (more trials at once)
    .venv/bin/python bench/sweep_cost.py --elastic --cpus 5 --epochs 3 --lrs 1e-3,1e-2 --batches 64,128

**Elastic trials** (``--elastic``): the same ASHA sweep twice on the same cluster, trials fixed at
``--max-workers`` workers and elastic (``scaling.num_workers=[1, max]``, resize check every 2 s). Elastic trials
start at what fits, so more run at once, and grow into the workers that ASHA frees. Reports each sweep's wall,
best val_loss and every trial's world sizes; ``grown`` lists the trials that trained at a larger world size
later than earlier.

**The anchor** (``per_trial``): the least a user could write with Ray Tune + ``TorchTrainer`` (a function
trainable per trial that fits a TorchTrainer whose workers run a plain DDP loop on digits and report a checkpoint
per epoch, with ``TuneReportCallback``; one trial at a time, so it cannot deadlock), against ``jobs.sweep`` with
every feature on (MLflow parent and children, the best model logged, elastic restarts, goodput) over the same
trials: same learning rates, global batches, epochs and workers per trial. The two sides alternate
(``--rounds``); ``ratio`` is the median ``jobs.sweep`` wall over the median anchor wall (goal <= 1.1; issue 33:
<= 0.7). Each sweep, either side, is its own driver process on the bench's Ray cluster (as a user runs a script or
``python -m jobs.sweep`` against a cluster), timed from its process start to its end.

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
import subprocess
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


RUN_TIMEOUT_S = 3600  # one sweep (either side): a hung cluster ends the bench with a clear error


def run(home: Path, name: str, args: argparse.Namespace, *overrides: str) -> dict:
    summary = home / f"{name}.json"
    argv = ["--config", str(ROOT / "configs/sweep-digits.yaml"), f"name={name}",
            f"checkpoint.storage_path={home / 'results'}", f"train.epochs={args.epochs}", "sweep.search=grid",
            "sweep.num_samples=1", space(args.lrs, args.batches), "tracking.experiment=bench-sweep-cost",
            f"sweep.max_concurrent_trials={args.concurrency}", *overrides, "--summary-json", str(summary)]
    started = time.time()
    # Its own driver process on the bench's cluster, as a user runs it (its own job, timed from its process
    # start like the anchor's); Tune's tables and the ranking to stderr, stdout is the JSON
    rc = subprocess.run([sys.executable, "-m", "jobs.sweep", *argv], cwd=ROOT, stdout=sys.stderr,
                        timeout=RUN_TIMEOUT_S).returncode
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
        "world_sizes": {t["trial_id"]: t["world_sizes"] for t in s["trials"]},
        "grown": [t["trial_id"] for t in s["trials"] if grew(t["world_sizes"])],
        "driver_phases_s": s.get("phases"),  # where the sweep driver's wall went (they add up to it)
    }


def grew(sizes: list[int]) -> bool:
    """A trial trained at a larger world size after a smaller one."""
    return any(b > a for a, b in zip(sizes, sizes[1:], strict=False))


def elastic(home: Path, args: argparse.Namespace) -> dict:
    """The same ASHA sweep with fixed-size and with elastic trials on the same cluster (module docstring)."""
    common = ("sweep.scheduler=asha", "sweep.grace_period=1", f"sweep.reduction_factor={args.reduction_factor}",
              "scaling.resize_check_interval_s=2")
    fixed = run(home, "fixed", args, f"scaling.num_workers={args.max_workers}", *common)
    grown = run(home, "elastic", args, f"scaling.num_workers=[1, {args.max_workers}]", *common)
    return {"workload": {"data": "digits", "epochs": args.epochs, "lrs": args.lrs, "global_batch_sizes":
                         args.batches, "cpus": args.cpus, "max_workers": args.max_workers},
            "fixed": fixed, "elastic": grown,
            "wall_ratio": round(grown["wall_s"] / fixed["wall_s"], 3),
            "best_gap": round((grown["best_metric"] - fixed["best_metric"]) / abs(fixed["best_metric"]), 6)}


def anchor_loop(config: dict) -> None:
    """A user's plain DDP loop on digits: what the anchor's workers run (module level: Ray pickles it)."""
    import tempfile

    import ray.train
    import ray.train.torch
    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).flatten(1) / 16.0
    y = torch.tensor(d.target)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    cut = int(len(x) * 0.8)
    tr, va = perm[:cut], perm[cut:]
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256),
                                                        nn.ReLU(), nn.Linear(256, 10)))
    opt = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.01)
    micro = config["batch"] // world
    for epoch in range(config["epochs"]):
        order = tr[torch.randperm(len(tr), generator=torch.Generator().manual_seed(epoch))]
        model.train()
        for s in range(len(order) // config["batch"]):
            idx = order[s * config["batch"] + rank * micro: s * config["batch"] + (rank + 1) * micro]
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val_loss = nn.functional.cross_entropy(model(x[va]), y[va]).item()
        with tempfile.TemporaryDirectory() as tmp:
            if rank == 0:
                torch.save(model.state_dict(), f"{tmp}/model.pt")
            ray.train.report({"val_loss": val_loss, "epoch": epoch + 1},
                             checkpoint=ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None)


def anchor_trial(config: dict) -> None:
    """One anchor trial: a TorchTrainer fitted inside a Tune function trainable (the Train V2 way)."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    TorchTrainer(anchor_loop, train_loop_config=config,
                 scaling_config=ScalingConfig(num_workers=config["workers"]),
                 run_config=RunConfig(name=f"anchor-{tune.get_context().get_trial_id()}",
                                      storage_path=config["storage"], callbacks=[TuneReportCallback()])).fit()


def run_anchor(home: Path, name: str, args: argparse.Namespace) -> dict:
    """The anchor sweep in its own driver process on the bench's cluster (as :func:`run` runs ``jobs.sweep``)."""
    out = home / f"{name}.anchor.json"
    cmd = [sys.executable, __file__, "--anchor-run", name, "--anchor-out", str(out), "--epochs", str(args.epochs),
           "--workers", str(args.workers), "--lrs", ",".join(map(repr, args.lrs)),
           "--batches", ",".join(map(str, args.batches))]
    started = time.time()
    rc = subprocess.run(cmd, cwd=ROOT, stdout=sys.stderr, timeout=RUN_TIMEOUT_S).returncode
    assert rc == 0, f"{name} anchor sweep exited {rc}"
    # its wall as jobs.sweep's: the whole driver process (interpreter, imports, connecting included)
    return {**json.loads(out.read_text()), "wall_s": round(time.time() - started, 1)}


def anchor_sweep(home: Path, name: str, args: argparse.Namespace) -> dict:
    """The anchor sweep over ``args.lrs`` x ``args.batches``: one trial at a time; its wall and best val_loss."""
    from ray import tune

    started = time.time()
    space = {"lr": tune.grid_search(list(args.lrs)), "batch": tune.grid_search(list(args.batches)),
             "epochs": args.epochs, "workers": args.workers, "storage": str(home / "anchor")}
    with contextlib.redirect_stdout(sys.stderr):  # Tune's start banner; stdout is the JSON
        grid = tune.Tuner(
            tune.with_resources(anchor_trial, {"CPU": 1}), param_space=space,
            tune_config=tune.TuneConfig(metric="val_loss", mode="min", max_concurrent_trials=1),
            run_config=tune.RunConfig(name=name, storage_path=str(home / "anchor"), verbose=0),
        ).fit()
    best = grid.get_best_result(scope="all")
    return {"wall_s": round(time.time() - started, 1), "trials": len(grid), "best_metric": best.metrics["val_loss"]}


def trial_phases(folder: Path, trial_ids: list[str]) -> dict:
    """Where a jobs.sweep trial's driver spent its time (the median over the sweep's trials, seconds): from its
    process start to ``run_trial`` (``process``), then each phase of ``run_trial`` (``fit`` is the Train run)."""
    import statistics

    rows = [json.loads((folder / f"{t}.json").read_text()) for t in trial_ids if (folder / f"{t}.json").exists()]
    per: dict[str, list[float]] = {}
    for r in rows:
        if r.get("process_start"):
            per.setdefault("process", []).append(r["launched"] - r["process_start"])
        for name, secs in r["phases"]:
            per.setdefault(name, []).append(secs)
        for part in ("startup", "teardown"):  # the trial's own summary: where fit's start and end went
            for name, secs in (r.get(part) or {}).items():
                per.setdefault(f"{part}: {name}", []).append(secs)
    return {k: round(statistics.median(v), 2) for k, v in per.items()}


def per_trial(home: Path, args: argparse.Namespace) -> dict:
    """jobs.sweep (every feature on) against the anchor over the same trials, alternated; medians and ratio."""
    import statistics

    ours, anchor = [], []
    for i in range(args.rounds):
        sides = [("ours", ours), ("anchor", anchor)] if i % 2 == 0 else [("anchor", anchor), ("ours", ours)]
        for side, out in sides:
            if side == "ours":
                out.append(run(home, f"ours-{i}", args, "sweep.scheduler=none", "sweep.max_concurrent_trials=1",
                               f"scaling.num_workers={args.workers}", "tracking.register_model=bench-sweep-cost"))
                out[-1]["trial_phases_s"] = trial_phases(home / "timelines", list(out[-1]["world_sizes"]))
            else:
                out.append(run_anchor(home, f"anchor-{i}", args))
    o, a = statistics.median(r["wall_s"] for r in ours), statistics.median(r["wall_s"] for r in anchor)
    trials = len(args.lrs) * len(args.batches)
    return {"trials_per_sweep": trials, "epochs": args.epochs, "workers_per_trial": args.workers,
            "rounds": args.rounds, "jobs_sweep": ours, "anchor": anchor, "jobs_sweep_median_s": o,
            "anchor_median_s": a, "ratio": round(o / a, 3), "per_trial_overhead_s": round((o - a) / trials, 1),
            "goal": {"ratio_max": 1.1, "met": o / a <= 1.1}}


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
    p.add_argument("--workers", type=int, default=1, help="workers per trial in the anchor comparison")
    p.add_argument("--rounds", type=int, default=2, help="alternations of jobs.sweep and the anchor")
    p.add_argument("--smoke", action="store_true", help="the anchor comparison only: 2 trials x 1 epoch, 1 round")
    p.add_argument("--per-trial", action="store_true",
                   help="the anchor comparison only, at its full size (6 trials x 2 epochs, --rounds rounds)")
    p.add_argument("--elastic", action="store_true", help="fixed-size against elastic trials only (docstring)")
    p.add_argument("--max-workers", type=int, default=2, help="--elastic: workers per trial (the elastic max)")
    p.add_argument("--anchor-run", help=argparse.SUPPRESS)  # internal: one anchor sweep as its own driver
    p.add_argument("--anchor-out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.anchor_run:
        import ray

        ray.init(logging_level="ERROR")  # $RAY_ADDRESS: the bench's cluster
        home = Path(os.environ["ELASTIC_TRAIN_HOME"])
        Path(args.anchor_out).write_text(json.dumps(anchor_sweep(home, args.anchor_run, args)))
        return 0
    if args.smoke:
        args.epochs, args.lrs, args.batches, args.rounds = 1, [3e-4, 1e-2], [128], 1
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    import ray

    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        home = Path(tmp)
        os.environ["ELASTIC_TRAIN_HOME"] = str(home)
        # Each jobs.sweep trial writes where its driver's time went (set before Ray starts: trials inherit it)
        os.environ["ELASTIC_TRAIN_TRIAL_TIMELINE"] = str(home / "timelines")
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        if args.address:
            ray.init(address=args.address, logging_level="ERROR")
        else:
            ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address  # each side's driver joins this cluster
        try:
            if args.elastic:
                print(json.dumps(elastic(home, args), indent=2))
                return 0
            anchor = per_trial(home, argparse.Namespace(**{**vars(args), "lrs": args.lrs[:3], "batches":
                                                          args.batches[:2], "epochs": min(args.epochs, 2)}))
            if args.smoke or args.per_trial:
                print(json.dumps({"measured": "smoke" if args.smoke else "per trial", "per_trial": anchor}, indent=2))
                return 0
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
        "per_trial": anchor,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
