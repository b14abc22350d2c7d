"""Recovery time after a worker dies, and training time lost to checkpoints. Prints JSON.

    .venv/bin/python bench/recovery.py             # 3 alternating pairs + the cadence run: ~4 minutes on 2 cores
    .venv/bin/python bench/recovery.py --pairs 1   # ~2 minutes

On a local two-node cluster (ray.cluster_utils.Cluster, one CPU per node, one worker per node):

* ``engine_recovery_s``: ``jobs.train`` with 2 workers; rank 1's process dies at step 60 (``os._exit``, as
  a lost machine). Time from the last step before the death to the first step after it, from the run's
  goodput ledger (``restart_lost_s``; heartbeats every step here). Goal <= 10 s. ``engine_phases_s`` splits
  the time from the fault to the first step after it: Ray Train's detection, teardown, placement and process
  start (``ray_restart_s``) and process group and dispatch (``worker_setup_s``); our build, restore and first
  step (see docs/faults.md). ``engine_ray_train_phases_s`` splits Ray Train's two at the Train controller's own
  events: detection, teardown, placement, process start, process group, dispatch.
* ``bare_ray_train_recovery_s``: the anchor, measured in the same run: a minimal Ray Train loop with Ray's
  defaults, killed the same way, timed from step timestamps it writes itself.
* The two sides alternate (bare first in even pairs, the engine first in odd ones), ``--pairs`` times; the
  figures are medians, each pair's are in ``pairs``.
* ``checkpoint_share``: a failure-free run at the default checkpoint cadence (every 120 s and every epoch
  end; 3 epochs of ~4 s here): time training was blocked on checkpoint save + report, over training time.
  Goal <= 2%. Validation is the user's own cost and is counted apart (``eval_share``), as is the final
  checkpoint's run summary (the tracking flush: teardown). ``per_checkpoint_s`` is the cost of one (the share
  for other epoch lengths follows from it: ~16 ms against a 1 s epoch is 1.6%).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KILL_STEP = 60


def workload(*extra: str) -> list[str]:
    return ["data.name=synthetic", "data.num_samples=16384", "data.num_features=128", "model.hidden_sizes=[512,512]",
            "train.global_batch_size=128", "train.optimizer=sgd", "train.lr=0.05", "train.schedule=constant",
            "train.warmup_steps=0", "tracking.system_metrics=false", *extra]


def engine_recovery(home: Path, spares: bool = True) -> dict:
    """``spares``: the default (a warm spare per worker; the fault waits for them: a run in its steady state);
    else ``failure.spare_workers=0`` (every new worker is a cold process: a fault early in a run)."""
    from jobs import train

    home.mkdir(parents=True, exist_ok=True)
    when = ",when=spares-warm" if spares else ""
    os.environ["ELASTIC_TRAIN_FAULT"] = (f"step={KILL_STEP},rank=1,marker={home / 'fired'}{when};"
                                        f"markers={home / 'phases'}")
    try:
        summary = home / "recovery.json"
        rc = train.main(["--config", str(ROOT / "configs/digits.yaml"),
                         *workload("train.epochs=3", "scaling.num_workers=2", "scaling.placement_strategy=SPREAD",
                                   "checkpoint.every_steps=20", "tracking.log_every_steps=1",
                                   f"name=recovery-{home.name}", f"checkpoint.storage_path={home / 'results'}",
                                   f"failure.spare_workers={'auto' if spares else 0}", "failure.spares_after_s=0"),
                         "--summary-json", str(summary)])
    finally:
        del os.environ["ELASTIC_TRAIN_FAULT"]
    assert rc == 0, rc
    s = json.loads(summary.read_text())
    from bench.chaos import recovery_phases

    fired = json.loads((home / "fired").read_text())  # the fault's marker record: step, rank, mode, unix, pid
    split = recovery_phases({**fired, "fired_step": fired["step"]}, home / "phases") or {}
    return {"recovery_s": s["goodput"]["restart_lost_s"], "recomputed_steps": s["goodput"]["recomputed_steps"],
            "restarts": s["restarts"], "fault_to_first_step_s": split.get("recovery_s"),
            "phases_s": split.get("phases_s"), "ray_train_phases_s": split.get("ray_train_phases_s"),
            "spares": spare_use(home / "phases", fired["unix"])}


def spare_use(phases: Path, fault_unix: float) -> dict:
    """Whether the restarted group ran on warm spares (train/spares.py): the new workers' processes started
    before the fault (a spare) or after it (a cold start), and the spares the keepers saw before the fault."""
    records = [json.loads(line) for f in sorted(phases.glob("phases.rank*.jsonl"))
               for line in f.read_text().splitlines()]
    contexts = [r for r in records if r["event"] == "context" and r["unix"] > fault_unix]
    seen = [r for r in records if r["event"] == "spares" and r["unix"] < fault_unix]
    return {"new_workers_from_spares": sum(r["process_start"] < fault_unix for r in contexts),
            "new_workers": len(contexts), "spares_before_fault": seen[-1]["pids"] if seen else "",
            "keeper_errors": [r["error"] for r in records if r["event"] == "spares_failed"][:3]}


def checkpoint_share(home: Path) -> dict:
    from jobs import train

    summary = home / "cadence.json"
    rc = train.main(["--config", str(ROOT / "configs/digits.yaml"),
                     *workload("data.num_samples=65536", "train.epochs=3", "scaling.num_workers=2", "name=cadence",
                               f"checkpoint.storage_path={home / 'results'}"),
                     "--summary-json", str(summary)])
    assert rc == 0, rc
    g = json.loads(summary.read_text())["goodput"]
    epochs = 3  # one checkpoint per epoch end at the default cadence (the last one is the final)
    return {"checkpoint_s": g["checkpoint_s"], "productive_s": g["productive_s"], "eval_s": g["eval_s"],
            "per_checkpoint_s": g["checkpoint_s"] / epochs,
            "share": g["checkpoint_s"] / (g["checkpoint_s"] + g["productive_s"]),
            "eval_share": g["eval_s"] / (g["eval_s"] + g["productive_s"])}


def bare_ray_train(home: Path) -> float:
    """The anchor: a plain Ray Train loop (Ray's defaults), a worker process killed at the same step."""
    import ray.train
    import torch
    from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    home.mkdir(parents=True, exist_ok=True)
    stamps = home / "bare-steps.jsonl"
    marker = home / "bare-fired"

    def loop(config: dict) -> None:
        ctx = ray.train.get_context()
        start = 0
        ckpt = ray.train.get_checkpoint()
        if ckpt:
            with ckpt.as_directory() as d:
                start = int(Path(d, "step").read_text())
        model = ray.train.torch.prepare_model(torch.nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(64, 128), torch.randint(0, 10, (64,))
        for step in range(start + 1, 121):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if ctx.get_world_rank() == 0:
                with open(config["stamps"], "a") as f:
                    f.write(json.dumps({"step": step, "t": time.time()}) + "\n")
            if step == config["kill"] and ctx.get_world_rank() == 1 and not os.path.exists(config["marker"]):
                Path(config["marker"]).write_text("x")
                os._exit(1)
            if step % 20 == 0:
                with tempfile.TemporaryDirectory() as d:
                    Path(d, "step").write_text(str(step))
                    ray.train.report({"step": step}, checkpoint=Checkpoint.from_directory(d))
            time.sleep(0.02)

    env_backup = os.environ.pop("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", None)  # Ray's default (2 s) for the anchor
    try:
        TorchTrainer(loop, train_loop_config={"stamps": str(stamps), "marker": str(marker), "kill": KILL_STEP},
                     scaling_config=ScalingConfig(num_workers=2, placement_strategy="SPREAD"),
                     run_config=RunConfig(name=f"bare-{home.name}", storage_path=str(home / "bare"),
                                          failure_config=FailureConfig(max_failures=2))).fit()
    finally:
        if env_backup is not None:
            os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = env_backup
    records = [json.loads(line) for line in stamps.read_text().splitlines()]
    # the restart shows as a step number going back (to the last checkpoint) after the kill
    for prev, cur in zip(records, records[1:], strict=False):
        if cur["step"] <= prev["step"]:
            return cur["t"] - prev["t"]
    raise RuntimeError("the bare run never restarted")


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="engine / bare Ray Train recoveries, alternating (default 3)")
    ap.add_argument("--only", choices=("engine", "cold", "bare"),
                    help="one side only (no ratio; for working on one side)")
    ap.add_argument("--no-cadence", action="store_true", help="skip the checkpoint-share run")
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error(f"--pairs must be >= 1, got {args.pairs}")
    import ray
    from ray.cluster_utils import Cluster

    pairs: list[dict] = []
    with contextlib.redirect_stdout(sys.stderr):  # the runs' consoles: stdout is this benchmark's JSON
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, logging_level="ERROR")
        cluster.wait_for_nodes()
        try:
            with tempfile.TemporaryDirectory(prefix="et-recovery-") as tmp:
                home = Path(tmp)
                os.environ["ELASTIC_TRAIN_HOME"] = str(home)
                for i in range(args.pairs):
                    pair: dict = {}
                    sides = ("bare", "engine", "cold")
                    for side in (sides if i % 2 == 0 else sides[::-1]):
                        if args.only and side != args.only:
                            continue
                        if side == "bare":
                            pair["bare"] = bare_ray_train(home / f"bare-{i}")
                        else:
                            pair[side] = engine_recovery(home / f"{side}-{i}", spares=side == "engine")
                    pairs.append(pair)
                cadence = {} if args.no_cadence else checkpoint_share(home)
        finally:
            ray.shutdown()
            cluster.shutdown()
    if args.only:
        print(json.dumps({"benchmark": "recovery", "only": args.only, "pairs": pairs}, indent=2))
        return
    engines = [p["engine"] for p in pairs]
    median_engine = sorted(engines, key=lambda e: e["recovery_s"])[len(engines) // 2]  # its phases are reported
    print(json.dumps({
        "benchmark": "recovery",
        "cluster": "ray.cluster_utils.Cluster, 2 nodes x 1 CPU, 2 workers",
        "statistic": f"median over {args.pairs} pair(s); sides alternate",
        "engine_recovery_s": _median([e["recovery_s"] for e in engines]),
        "bare_ray_train_recovery_s": _median([p["bare"] for p in pairs]),
        "goal_recovery_s": 10.0,
        "engine_over_bare": _median([p["engine"]["recovery_s"] / p["bare"] for p in pairs]),
        # the same engine with failure.spare_workers=0: every new worker a cold process (a fault before the
        # spares are warm: train/spares.py)
        "engine_cold_recovery_s": _median([p["cold"]["recovery_s"] for p in pairs]),
        "engine_cold_over_bare": _median([p["cold"]["recovery_s"] / p["bare"] for p in pairs]),
        "engine_recomputed_steps": median_engine["recomputed_steps"],
        # the same recovery from the fault itself to the first step after it, split where the workers can see:
        # ray_restart_s + worker_setup_s are Ray Train's, build_s + restore_s + first_step_s ours (docs/faults.md)
        "engine_fault_to_first_step_s": median_engine["fault_to_first_step_s"],
        "engine_phases_s": median_engine["phases_s"],
        # ray_restart_s + worker_setup_s split at the Train controller's events (launch/controller.RestartPhases)
        "engine_ray_train_phases_s": median_engine["ray_train_phases_s"],
        "pairs": [{"engine_recovery_s": round(p["engine"]["recovery_s"], 2), "bare_ray_train_recovery_s":
                   round(p["bare"], 2), "engine_phases_s": p["engine"]["phases_s"],
                   "engine_ray_train_phases_s": p["engine"]["ray_train_phases_s"],
                   "engine_spares": p["engine"]["spares"], "engine_cold_recovery_s": round(p["cold"]["recovery_s"], 2),
                   "engine_cold_phases_s": p["cold"]["ray_train_phases_s"]} for p in pairs],
        **({} if not cadence else {  # --no-cadence: no checkpoint-share run
            "checkpoint_share": round(cadence["share"], 4),
            "goal_checkpoint_share": 0.02,
            "checkpoint_s": round(cadence["checkpoint_s"], 3),
            "per_checkpoint_s": round(cadence["per_checkpoint_s"], 3),
            "eval_share": round(cadence["eval_share"], 4),
            "training_s": round(cadence["productive_s"], 2),
        }),
    }, indent=2))


if __name__ == "__main__":
    main()
