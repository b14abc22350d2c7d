"""A fault campaign: one training run, a seeded schedule of faults, and what was injected, survived and lost.

    .venv/bin/python bench/chaos.py --smoke          # 5 faults, ~2-3 minutes on a loaded 2-core box
    .venv/bin/python bench/chaos.py --seed 7         # 20 faults (the campaign), ~5-8 minutes on 2 cores
    .venv/bin/python bench/chaos.py --faults 30 --epochs 12 --workers 2

The run is ``jobs.train`` on the digits preset with ``scaling.num_workers=[1,N]`` on an embedded Ray, and
``$ELASTIC_TRAIN_FAULT`` (elastic_train/train/faults.py) carries the schedule, drawn from ``--seed``: worker
process deaths (``exit``, as a lost process), a worker raising (``raise``), a death inside a checkpoint save
(``save``: written, never reported) and pairs of faults closer together than one checkpoint interval
(``pair``). A fault-free run with the same config is the reference.

Printed JSON: each fault (kind, scheduled and fired step, rank, recovery time split into phases, steps lost),
and totals: injected, survived, samples lost and repeated (sample-id trace), mean and worst recovery, restarts,
goodput, whether MLflow holds every step's metrics once, and the final ``params_sha256`` against the
fault-free run's (bitwise when the world size never changed; otherwise the train loss within 1e-4 relative).

Phases of one recovery (unix times noted by the workers, ``markers=DIR`` in the fault spec):
``ray_restart_s`` fault -> new worker process started (Ray: detection, teardown, placement, process start; Ray's
logs would be needed to split it further); ``worker_setup_s`` process start -> our train function entered (Ray:
the torch process group, imports, dispatch); ``build_s`` -> data and model built, DDP wrapped (ours);
``restore_s`` -> checkpoint loaded (ours); ``first_step_s`` -> the first optimizer step done (ours).

Not here (yet): node removal on ray.cluster_utils.Cluster (tests/cluster/test_elastic.py covers one), the driver
killed and resumed (tests/distributed/test_train.py), an MLflow outage (tests/e2e/test_tracking.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

N_TRAIN, GLOBAL_BATCH = 1438, 128  # digits: train samples, and the preset's global batch
STEPS_PER_EPOCH = N_TRAIN // GLOBAL_BATCH
KINDS = ("exit", "raise", "save", "pair")


def draw_schedule(seed: int, n_faults: int, total_steps: int, every: int, workers: int) -> list[dict]:
    """``n_faults`` faults at distinct steps in [2, total_steps - 2], drawn from ``seed``. A ``pair`` is two
    faults (exit then raise, or the reverse) one to ``every - 1`` steps apart: closer than one checkpoint."""
    rng = random.Random(seed)
    free = set(range(2, total_steps - 1))
    faults: list[dict] = []
    while len(faults) < n_faults and free:
        kind = rng.choice(KINDS if n_faults - len(faults) >= 2 else KINDS[:3])
        step = rng.choice(sorted(free))
        if kind == "pair":
            second = step + rng.randint(1, max(1, every - 1))
            if second not in free:
                continue
            first_mode, second_mode = rng.sample(["exit", "raise"], 2)
            faults.append({"kind": "pair", "mode": first_mode, "step": step, "rank": rng.randrange(workers)})
            faults.append({"kind": "pair", "mode": second_mode, "step": second, "rank": rng.randrange(workers)})
            free -= {step, second}
        else:
            faults.append({"kind": kind, "mode": kind, "step": step, "rank": rng.randrange(workers)})
            free.discard(step)
    return sorted(faults, key=lambda f: f["step"])


def fault_spec(schedule: list[dict], markers: Path) -> str:
    return ";".join(f"step={f['step']},rank={f['rank']},mode={f['mode']}" for f in schedule) + f";markers={markers}"


def run(home: Path, name: str, overrides: list[str], spec: str | None) -> dict:
    from jobs import train

    if spec:
        os.environ["ELASTIC_TRAIN_FAULT"] = spec
    try:
        out = home / f"{name}.json"
        rc = train.main(["--config", str(ROOT / "configs/digits.yaml"), *overrides, f"name={name}",
                         f"checkpoint.storage_path={home / 'results'}", "--summary-json", str(out)])
    finally:
        os.environ.pop("ELASTIC_TRAIN_FAULT", None)
    summary = json.loads(out.read_text()) if out.exists() else {"status": "NO SUMMARY"}
    summary["exit_code"] = rc
    return summary


def read_jsonl(paths: list[Path]) -> list[dict]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines() if line.strip()]


def analyse(schedule: list[dict], markers: Path) -> list[dict]:
    """One row per scheduled fault: fired where and when, and rank 0's next attempt's phases."""
    fired = {}  # schedule index -> marker record
    for p in markers.glob("fault-*.json"):
        fired[int(p.stem.split("-")[1])] = json.loads(p.read_text())
    rows = []
    for i, f in enumerate(schedule):
        row = {"kind": f["kind"], "mode": f["mode"], "scheduled_step": f["step"], "rank": f["rank"], "fired": False}
        rec = fired.get(i)
        if rec is not None:
            row.update(fired=True, fired_step=rec["step"], unix=rec["unix"])
            row.update(recovery_phases(rec, markers) or {})
        rows.append(row)
    return rows


def recovery_phases(fault: dict, markers: Path) -> dict | None:
    """The recovery after ``fault`` (its marker record): rank 0's next attempt, noted in
    ``markers/phases.rank0.jsonl``, split into phases; None when no attempt followed it."""
    by_pid: dict[int, dict[str, dict]] = {}
    for r in read_jsonl(sorted(markers.glob("phases.rank0.jsonl"))):
        by_pid.setdefault(r["pid"], {})[r["event"]] = r
    attempts = sorted((a for a in by_pid.values() if "entered" in a), key=lambda a: a["entered"]["at"])
    a = next((a for a in attempts if a["entered"]["at"] > fault["unix"] and "first_step" in a), None)
    if a is None:
        return None
    entered = a["entered"]
    start = entered.get("process_start") or entered["at"]
    built, first = a["built"]["unix"], a["first_step"]["unix"]
    restored = a.get("restored", a["built"])["unix"]
    return {"recovery_s": round(first - fault["unix"], 2),
            "steps_lost": fault["step"] - (a["first_step"]["step"] - 1),
            "phases_s": {"ray_restart_s": round(start - fault["unix"], 2),
                         "worker_setup_s": round(entered["at"] - start, 2),
                         "build_s": round(built - entered["at"], 2), "restore_s": round(restored - built, 2),
                         "first_step_s": round(first - restored, 2)}}


def metric_steps_once(summary: dict) -> bool | None:
    """Every logged train_loss step appears once in the run's MLflow history, up to the last step."""
    try:
        from mlflow.tracking import MlflowClient

        history = MlflowClient(tracking_uri=summary["tracking_uri"]).get_metric_history(summary["mlflow_run_id"],
                                                                                        "train_loss")
    except Exception:  # noqa: BLE001 -- reported as unknown
        return None
    steps = [m.step for m in history]
    return bool(steps) and len(steps) == len(set(steps)) and max(steps) == summary.get("steps")


def campaign(args: argparse.Namespace, home: Path) -> dict:
    from tests.helpers.trace import exactly_once_problems, read_trace

    total = args.epochs * STEPS_PER_EPOCH
    schedule = draw_schedule(args.seed, args.faults, total, args.every, args.workers)
    markers, trace = home / "markers", home / "trace"
    common = [f"train.epochs={args.epochs}", "tracking.system_metrics=false", "data.loader_workers=0",
              f"scaling.num_workers=[1,{args.workers}]", f"checkpoint.every_steps={args.every}",
              "checkpoint.every_seconds=null", "failure.max_failures=-1"]
    t0 = time.time()
    clean = run(home, "clean", common, None)
    t1 = time.time()
    chaos = run(home, "chaos", [*common, f"data.trace_path={trace}"], fault_spec(schedule, markers))
    t2 = time.time()
    rows = analyse(schedule, markers)
    problems = exactly_once_problems(read_trace(trace), N_TRAIN, GLOBAL_BATCH, args.epochs)
    recoveries = [r["recovery_s"] for r in rows if "recovery_s" in r]
    same_world = chaos.get("world_sizes") == [args.workers] and clean.get("world_sizes") == [args.workers]
    a, b = (s.get("final_metrics", {}).get("train_loss") for s in (chaos, clean))
    return {
        "benchmark": "chaos", "seed": args.seed, "workers": f"[1,{args.workers}]", "epochs": args.epochs,
        "steps": total, "checkpoint_every_steps": args.every, "measured_under": "load (shared 2-core box)",
        "faults": rows,
        "totals": {
            "scheduled": len(schedule), "injected": sum(r["fired"] for r in rows),
            "survived": sum(r["fired"] for r in rows) if chaos.get("status") == "FINISHED" else 0,
            "status": chaos.get("status"), "exit_code": chaos.get("exit_code"),
            "restarts": chaos.get("restarts"), "world_sizes": chaos.get("world_sizes"),
            "exactly_once": not problems, "trace_problems": problems[:10],
            "mean_recovery_s": round(statistics.mean(recoveries), 2) if recoveries else None,
            "worst_recovery_s": round(max(recoveries), 2) if recoveries else None,
            "steps_lost": sum(r.get("steps_lost", 0) for r in rows),
            "recomputed_steps_ledger": (chaos.get("goodput") or {}).get("recomputed_steps"),
            "goodput": chaos.get("goodput"),
            "metrics_once_in_mlflow": metric_steps_once(chaos),
            "params_sha256": chaos.get("params_sha256"), "clean_params_sha256": clean.get("params_sha256"),
            "world_size_never_changed": same_world,
            "params_bitwise_equal": chaos.get("params_sha256") == clean.get("params_sha256") if same_world else None,
            "train_loss_rel_diff": abs(a - b) / abs(b) if a is not None and b else None,
            "clean_wall_s": round(t1 - t0, 1), "chaos_wall_s": round(t2 - t1, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", type=int, default=20)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="N in scaling.num_workers=[1,N]")
    p.add_argument("--every", type=int, default=5, help="checkpoint.every_steps")
    p.add_argument("--smoke", action="store_true", help="5 faults over 3 epochs (< 3 min)")
    args = p.parse_args(argv)
    if args.smoke:
        args.faults, args.epochs = 5, 3
    import ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    ray.init(address="local", num_cpus=args.workers + 2, include_dashboard=False, logging_level="ERROR")
    try:
        # the jobs' console (and the workers' forwarded lines) go to stderr: stdout is the JSON alone
        with tempfile.TemporaryDirectory(prefix="et-chaos-") as tmp, contextlib.redirect_stdout(sys.stderr):
            os.environ["ELASTIC_TRAIN_HOME"] = tmp
            report = campaign(args, Path(tmp))
    finally:
        ray.shutdown()
    print(json.dumps(report, indent=2))
    t = report["totals"]
    return 0 if t["status"] == "FINISHED" and t["exactly_once"] and t["injected"] == t["scheduled"] else 1


if __name__ == "__main__":
    sys.exit(main())
