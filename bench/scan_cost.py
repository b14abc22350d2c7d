"""What the sweep driver's placement-group scans cost on a cluster that has aged: one whose GCS actor table holds
thousands of dead actors of other jobs (issue 51, item 5). Prints JSON.

    .venv/bin/python bench/scan_cost.py                # 5,000 dead actors, a 6-trial ASHA sweep before and after
    .venv/bin/python bench/scan_cost.py --dead 20000   # an older cluster
    .venv/bin/python bench/scan_cost.py --smoke        # 500 dead actors, one 2-trial sweep (~1 min)

The reaper (``elastic_train/sweep/placement_groups.py``, feature ``sweep_reaper``) asks the GCS for this job's
actors in one state; the GCS filters by job and state before it answers, so a scan costs what the sweep holds, not
what the cluster's history holds. The bench shows it three ways on a private local Ray of ``--cpus`` CPUs:

* ``one_scan_ms``: the median of 20 of the reaper's scans (its two actor queries and the placement-group table),
  before and after another job leaves ``--dead`` dead actors -- named ``TrainController``, the class the reaper
  looks for, so only the job filter keeps them out -- beside ``whole_table_ms``, one read of the whole actor table
  (what a scan cost before the filter).
* ``sweep``: the same ASHA sweep (``jobs.sweep``, its own driver process, as a user runs it) on the fresh cluster
  and on the aged one: its wall, its scans and their seconds (the summary's ``placement_group_scans``), and
  ``scan_share``, those seconds over the sweep's wall. Goal: under 1 % on the aged cluster.

A dead actor is made cheaply: the filler job creates actors that ask for a resource no node has (so no worker
process starts), then kills them; the GCS keeps each as DEAD, as it keeps the actors of ended trials and jobs (up to
``RAY_maximum_gcs_destroyed_actor_cached_count``, 100,000 by default).
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
sys.path.insert(0, str(ROOT))

RUN_TIMEOUT_S = 1800  # one sweep; a hung cluster ends the bench with a clear error


class TrainController:
    """The class name the reaper asks the GCS for (module level: a class defined in a function is named
    ``fill.<locals>.TrainController`` in the actor table)."""

    def ping(self) -> None:
        pass


def fill(n: int) -> None:
    """In its own driver (its own job): ``n`` actors of class ``TrainController`` that never start, then killed."""
    import ray

    ray.init(logging_level="ERROR")  # $RAY_ADDRESS: the bench's cluster
    remote = ray.remote(num_cpus=0, resources={"nowhere": 1})(TrainController)
    batch = 500
    for start in range(0, n, batch):
        handles = [remote.remote() for _ in range(min(batch, n - start))]
        for h in handles:
            ray.kill(h)
    # the kills are asynchronous: wait (bounded) until the GCS holds them all as DEAD
    from elastic_train.compat.ray_core import gcs_actors

    job = ray.get_runtime_context().get_job_id()
    deadline = time.monotonic() + 120
    while len(gcs_actors(job, "DEAD", "TrainController")) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the GCS did not list {n} dead actors within 120 s")
        time.sleep(0.5)
    ray.shutdown()


def one_scan_ms(rounds: int = 20) -> dict:
    """The reaper's scan from this driver (a job with no trials), and one read of the whole actor table."""
    from elastic_train.compat.ray_core import _accessor
    from elastic_train.sweep.placement_groups import (
        actor_created_placement_groups,
        orphaned_placement_groups,
        stranded_cleaners,
    )

    scans, whole = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        orphaned_placement_groups()
        stranded_cleaners()
        actor_created_placement_groups()
        scans.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        n = len(_accessor().get_actor_table(None, None))
        whole.append((time.perf_counter() - t) * 1000)
    return {"scan_ms": round(statistics.median(scans), 2), "whole_table_ms": round(statistics.median(whole), 2),
            "actors_in_table": n}


def sweep(home: Path, name: str, args: argparse.Namespace) -> dict:
    summary = home / f"{name}.json"
    lrs = "[" + ", ".join(f"{x:.6e}" for x in args.lrs) + "]"
    argv = ["--config", str(ROOT / "configs/sweep-digits.yaml"), f"name={name}",
            f"checkpoint.storage_path={home / 'results'}", f"train.epochs={args.epochs}", "sweep.search=grid",
            "sweep.num_samples=1", f"sweep.space={{train.lr: {{type: grid, values: {lrs}}}}}",
            "sweep.scheduler=asha", "sweep.grace_period=1", "tracking.enabled=false", "--summary-json", str(summary)]
    started = time.time()
    rc = subprocess.run([sys.executable, "-m", "jobs.sweep", *argv], cwd=ROOT, stdout=sys.stderr,
                        timeout=RUN_TIMEOUT_S).returncode
    if rc != 0:
        raise SystemExit(f"the {name} sweep exited {rc}")
    s = json.loads(summary.read_text())
    wall = time.time() - started
    scans = s["placement_group_scans"]
    return {"wall_s": round(wall, 1), "trials": len(s["trials"]), "scans": scans["count"],
            "scan_s": scans["seconds"], "scan_share": round(scans["seconds"] / wall, 5)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dead", type=int, default=5000, help="dead actors another job leaves in the GCS's table")
    p.add_argument("--cpus", type=int, default=4, help="logical CPUs of the private local Ray")
    p.add_argument("--epochs", type=int, default=3, help="each trial's budget (ASHA's max_t)")
    p.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")],
                   default=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2], help="the swept learning rates (one trial each)")
    p.add_argument("--smoke", action="store_true", help="500 dead actors, 2 trials x 1 epoch, the aged sweep only")
    p.add_argument("--fill", type=int, help=argparse.SUPPRESS)  # internal: the filler job
    args = p.parse_args()
    if args.fill is not None:
        fill(args.fill)
        return 0
    if args.smoke:
        args.dead, args.epochs, args.lrs = 500, 1, [1e-3, 1e-2]
    import ray

    os.environ["ELASTIC_TRAIN_INTERNALS"] = os.environ.get("ELASTIC_TRAIN_INTERNALS", "on")
    with tempfile.TemporaryDirectory(prefix="bench-scan-") as tmp:
        home = Path(tmp)
        os.environ["ELASTIC_TRAIN_HOME"] = str(home)
        os.environ.pop("MLFLOW_TRACKING_URI", None)
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR")
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address  # the sweeps and the filler join it
        try:
            fresh_scan = one_scan_ms()
            fresh = None if args.smoke else sweep(home, "fresh", args)
            t = time.time()
            rc = subprocess.run([sys.executable, __file__, "--fill", str(args.dead)], cwd=ROOT,
                                timeout=RUN_TIMEOUT_S).returncode
            if rc != 0:
                raise SystemExit(f"the filler job exited {rc}")
            fill_s = time.time() - t
            aged_scan = one_scan_ms()
            aged = sweep(home, "aged", args)
        finally:
            ray.shutdown()
    out = {
        "workload": {"dead_actors": args.dead, "trials": len(args.lrs), "epochs": args.epochs, "cpus": args.cpus,
                     "scheduler": "asha"},
        "fill_s": round(fill_s, 1),
        "one_scan": {"fresh": fresh_scan, "aged": aged_scan},
        "sweep": {"fresh": fresh, "aged": aged},
        "goal": {"scan_share_max": 0.01, "met": aged["scan_share"] < 0.01},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
