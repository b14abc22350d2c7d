"""Goodput at scale: a discrete-event simulation of one training run fed by this machine's measured costs.

    .venv/bin/python bench/goodput_sim.py                       # 8, 1,024 and 16,384 GPUs; Llama 3's failure rate
    .venv/bin/python bench/goodput_sim.py --trace poisson --mtbf-node-s 2e6 --gpus 64,512
    .venv/bin/python bench/goodput_sim.py --trace file --failures times.txt   # one failure time (s) per line
    .venv/bin/python bench/goodput_sim.py --campaign report.json              # predict a bench/chaos.py campaign

Events: start-up, then segments of ``k`` steps each followed by a blocking checkpoint; a failure loses the work
since the last completed checkpoint and costs one recovery (each phase below); a failure during a recovery
starts it again. Goodput = productive (kept) step time over the wall. For ``auto`` the interval is decided by
``elastic_train.train.interval.choose`` (the engine's own code, imported) from what the simulated run has
measured: its checkpoint cost, its step time, its restarts over its wall, and the prior (the trace's MTBF per
GPU); as in the engine, it starts on the default cadence (every 120 s) until a checkpoint has been measured and
decides again at checkpoints (here at most once per 1 % of the wall: the choice moves by < 0.5 % in between).
The best interval is searched on the same failure traces (common random numbers).

Defaults are this machine's figures (docs/benchmarks.md): start-up 16.6 s (``bench/startup.py``, first step,
quiet box 2026-12-03), teardown 3.9 s (same run: workers stop 1.2, final model + tracking 1.3, Ray shutdown
1.4), checkpoint stall 11 ms (``bench/recovery.py`` 2026-12-04: 11 ms per checkpoint), step 0.125 s (the
campaign's digits step with its 0.1 s stretch), and the recovery phases of ``bench/recovery.py``'s median run
(detection 0.42, teardown 0.02, placement 2.15, process start 4.44, process group 1.32, dispatch 0.02, build
0.09, restore 0.01, first step 0.04 s). Every one is a flag.

How a phase grows with the number of nodes ``n`` (GPUs / ``--gpus-per-node``): modelling assumptions, each a
flag (``--growth PHASE=const|log|linear``), not measurements (one machine here):

* detection, teardown, dispatch: constant (Ray Train's controller polls every worker at once; its health-check
  period bounds detection);
* placement, process start, build, restore, first step: constant: each node starts its own processes, loads its
  own shard and steps in parallel; the checkpoint stall likewise (sharded, asynchronous upload: each rank
  writes its own part, ``bench/checkpoint_stall.py``);
* process group: grows with log2(n): the rendezvous and the communicators' bootstrap are tree- or ring-shaped
  collectives over all ranks;
* start-up: the process group's growth on top of the measured start-up.

Failure traces: ``poisson`` (independent nodes at ``--mtbf-node-s``); ``llama3`` (the same, at the rate of the
Llama 3 405B run: 419 unexpected interruptions in 54 days on 16,384 GPUs, Dubey et al. 2024, "The Llama 3 Herd of
Models", §3.3.4, which reports > 90 % effective training time; per node of 8 GPUs that is 54 d x 2048 / 419);
``file`` (cluster-wide failure times in seconds, one per line, used as given at every scale).

References: Young 1974 (CACM 17(9)) and Daly 2006 (FGCS 22(3)) for the optimum interval; CheckFreq (Mohan et al.,
FAST '21) for tuning it online. Output: JSON on stdout; ``--plot`` writes the goodput-vs-interval PNG (Agg).
Deterministic given ``--seed``; a few seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from elastic_train.train import interval  # noqa: E402  (the engine's decision, not a copy)

PHASES = ("detection_s", "teardown_s", "placement_s", "process_start_s", "process_group_s", "dispatch_s", "build_s",
          "restore_s", "first_step_s")
GROWTH = {"process_group_s": "log"}  # every other phase: const
LLAMA3_NODE_MTBF_S = 54 * 86400 * (16384 / 8) / 419
DEFAULT_SECONDS = 120.0  # checkpoint.every_seconds' default: the cadence before auto has measured anything
SCALES = (8, 1024, 16384)


@dataclass
class Costs:
    """Measured costs, seconds (defaults: this machine, docs/benchmarks.md; see the module docstring)."""

    startup_s: float = 16.6
    step_s: float = 0.125
    checkpoint_s: float = 0.011
    teardown_end_s: float = 3.9
    phases: dict[str, float] = field(default_factory=lambda: {
        "detection_s": 0.42, "teardown_s": 0.02, "placement_s": 2.15, "process_start_s": 4.44,
        "process_group_s": 1.32, "dispatch_s": 0.02, "build_s": 0.09, "restore_s": 0.01, "first_step_s": 0.04})
    growth: dict[str, str] = field(default_factory=lambda: dict(GROWTH))

    def factor(self, phase: str, nodes: int) -> float:
        law = self.growth.get(phase, "const")
        return {"const": 1.0, "log": 1.0 + math.log2(max(1, nodes)), "linear": float(max(1, nodes))}[law]

    def recovery_s(self, nodes: int) -> float:
        return sum(v * self.factor(k, nodes) for k, v in self.phases.items())

    def startup_at(self, nodes: int) -> float:
        pg = self.phases.get("process_group_s", 0.0)
        return self.startup_s + pg * (self.factor("process_group_s", nodes) - 1.0)


# ------------------------------------------------------------------------------------------------ traces


def poisson_trace(rng: random.Random, nodes: int, mtbf_node_s: float, horizon_s: float) -> list[float]:
    """Failure times of ``nodes`` independent nodes (exponential gaps): one merged Poisson process."""
    rate, t, out = nodes / mtbf_node_s, 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= horizon_s:
            return out
        out.append(t)


# ------------------------------------------------------------------------------------------------ one run


@dataclass
class Outcome:
    goodput: float
    productive_s: float
    checkpoint_s: float
    lost_s: float  # work done after the last checkpoint and lost, plus recoveries
    startup_s: float
    failures: int
    checkpoints: int
    final_every_steps: int | None


def simulate(costs: Costs, gpus: int, gpus_per_node: int, failures: list[float], horizon_s: float,
             every_steps: int | None, prior_mtbf_gpu_s: float | None = None, floor: int = 1) -> Outcome:
    """One run over ``horizon_s`` of wall: a fixed interval (``every_steps``) or ``auto`` (None)."""
    nodes = max(1, gpus // gpus_per_node)
    step, c, recovery = costs.step_s, costs.checkpoint_s, costs.recovery_s(nodes)
    t = startup = min(horizon_s, costs.startup_at(nodes))
    productive = ckpt = lost = 0.0
    n_fail = n_ckpt = 0
    k = every_steps or max(1, math.ceil(DEFAULT_SECONDS / step))
    fi = 0
    next_decision = 0.0
    while t < horizon_s:
        while fi < len(failures) and failures[fi] <= t:  # failures inside a recovery: it starts again
            n_fail += 1
            lost += failures[fi] + recovery - t if failures[fi] + recovery > t else 0.0
            t = max(t, failures[fi] + recovery)
            fi += 1
        if t >= horizon_s:
            break
        f = failures[fi] if fi < len(failures) else math.inf
        end = min(f, horizon_s)
        seg = k * step + c
        full = int((end - t) // seg)
        if every_steps is None and full > 0:  # auto: decide again at checkpoints, at most every 1 % of the wall
            full = min(full, max(1, int((0.01 * t) // seg)))
        if full > 0:
            t += full * seg
            productive += full * k * step
            ckpt += full * c
            n_ckpt += full
            if every_steps is None and t >= next_decision:
                wall = t
                choice = interval.choose(checkpoint_s=ckpt, checkpoints=n_ckpt, step_s=step, restarts=n_fail,
                                         wall_s=wall, prior_mtbf_s=prior_mtbf_gpu_s, workers=gpus, floor=floor)
                if choice is not None:
                    k = choice.every_steps
                next_decision = t
            continue
        if end == horizon_s and f > horizon_s:  # the run ends: what it did since the checkpoint counts
            productive += horizon_s - t
            t = horizon_s
            break
        lost += f - t  # the segment in flight is lost, then the recovery
        t = f
    teardown = min(costs.teardown_end_s, productive)
    productive -= teardown  # the run ends with its final checkpoint and teardown inside the wall
    return Outcome(productive / horizon_s, productive, ckpt, lost, startup, n_fail, n_ckpt,
                   k if every_steps is None else every_steps)


def mean_goodput(costs: Costs, gpus: int, gpus_per_node: int, traces: list[list[float]], horizon_s: float,
                 every_steps: int | None, prior: float | None, floor: int = 1) -> tuple[float, list[Outcome]]:
    runs = [simulate(costs, gpus, gpus_per_node, tr, horizon_s, every_steps, prior, floor) for tr in traces]
    return statistics.fmean(r.goodput for r in runs), runs


def search(costs: Costs, gpus: int, gpus_per_node: int, traces: list[list[float]], horizon_s: float,
           points: int = 40) -> tuple[int, float, list[tuple[int, float]]]:
    """The best fixed interval (steps): a log grid from 1 step to the horizon, then every step around the best
    grid point's neighbours (golden refinement on integers)."""
    top = max(2, int(horizon_s / costs.step_s))
    grid = sorted({max(1, round(math.exp(math.log(top) * i / (points - 1)))) for i in range(points)})
    curve = [(k, mean_goodput(costs, gpus, gpus_per_node, traces, horizon_s, k, None)[0]) for k in grid]
    i = max(range(len(curve)), key=lambda j: curve[j][1])
    lo, hi = curve[max(0, i - 1)][0], curve[min(len(curve) - 1, i + 1)][0]
    best_k, best = curve[i]
    for _ in range(30):  # golden-section on [lo, hi], integers
        if hi - lo < 3:
            break
        a, b = lo + round((hi - lo) * 0.382), lo + round((hi - lo) * 0.618)
        ga = mean_goodput(costs, gpus, gpus_per_node, traces, horizon_s, a, None)[0]
        gb = mean_goodput(costs, gpus, gpus_per_node, traces, horizon_s, b, None)[0]
        for k, g in ((a, ga), (b, gb)):
            if g > best:
                best_k, best = k, g
        lo, hi = (lo, b) if ga >= gb else (a, hi)
    return best_k, best, curve


def at_scale(args: argparse.Namespace, costs: Costs) -> dict:
    horizon = args.days * 86400
    rows = []
    file_trace = [float(x) for x in Path(args.failures).read_text().split()] if args.trace == "file" else None
    for gpus in args.gpus:
        nodes = max(1, gpus // args.gpus_per_node)
        rng = random.Random(f"{args.seed}-{gpus}")
        if file_trace is not None:
            traces = [sorted(file_trace)]
        else:
            traces = [poisson_trace(rng, nodes, args.mtbf_node_s, horizon) for _ in range(args.replicas)]
        prior = args.mtbf_node_s * args.gpus_per_node if args.trace != "file" else None  # per GPU (= per worker)
        fixed = {str(k): round(100 * mean_goodput(costs, gpus, args.gpus_per_node, traces, horizon, k, None)[0], 3)
                 for k in args.fixed}
        g_auto, runs = mean_goodput(costs, gpus, args.gpus_per_node, traces, horizon, None, prior)
        g_auto_np, _ = mean_goodput(costs, gpus, args.gpus_per_node, traces, horizon, None, None)
        best_k, best, curve = search(costs, gpus, args.gpus_per_node, traces, horizon)
        first = interval.choose(checkpoint_s=costs.checkpoint_s, checkpoints=1, step_s=costs.step_s, restarts=0,
                                wall_s=0.0, prior_mtbf_s=prior, workers=gpus) if prior else None
        rows.append({
            "gpus": gpus, "nodes": nodes, "failures_mean": statistics.fmean(r.failures for r in runs),
            "cluster_mtbf_s": (args.mtbf_node_s / nodes) if file_trace is None else None,
            "recovery_s": round(costs.recovery_s(nodes), 2), "startup_s": round(costs.startup_at(nodes), 2),
            "fixed_goodput_pct": fixed,
            "auto_goodput_pct": round(100 * g_auto, 3),
            "auto_every_steps_final_median": statistics.median(r.final_every_steps for r in runs),
            "auto_every_steps_from_prior": first.every_steps if first else None,
            "auto_no_prior_goodput_pct": round(100 * g_auto_np, 3),
            "best_every_steps": best_k, "best_goodput_pct": round(100 * best, 3),
            "auto_gap_points": round(100 * (best - g_auto), 3),
            "curve": [(k, round(100 * g, 3)) for k, g in curve],
        })
    return {"benchmark": "goodput_sim", "trace": args.trace, "mtbf_node_s": args.mtbf_node_s,
            "gpus_per_node": args.gpus_per_node, "days": args.days, "replicas": args.replicas, "seed": args.seed,
            "costs": asdict(costs), "scales": rows,
            "auto_within_half_point": all(r["auto_gap_points"] <= 0.5 for r in rows)}


# ------------------------------------------------------------------------------------------------ campaigns


def campaign_costs(report: dict) -> tuple[Costs, dict]:
    """Costs measured by a ``bench/chaos.py`` report: its driver's start-up, teardown, step time, checkpoint
    blocking time and the median of its recoveries (fault to the first step after it)."""
    g = report["totals"]["goodput"]
    steps = report["steps"]
    recoveries = [r["recovery_s"] for r in report["faults"] if r.get("recovery_s") is not None]
    costs = Costs(startup_s=g["startup_s"], step_s=g["productive_s"] / steps,
                  checkpoint_s=0.0, teardown_end_s=g["teardown_s"] + g.get("other_s", 0.0),
                  phases={"recovery_s": statistics.median(recoveries) if recoveries else 0.0}, growth={})
    return costs, {"blocking_s": g["checkpoint_s"] + g["eval_s"]}


def predict_campaign(report: dict, costs: Costs | None = None) -> dict:
    """The campaign's goodput as the simulator predicts it from its schedule (fault kinds at steps, the
    checkpoint cadence: every N steps, epoch ends, final) and its measured costs; beside the measured figure."""
    measured_costs, extra = campaign_costs(report)
    costs = costs or measured_costs
    steps, every, epochs = report["steps"], report["checkpoint_every_steps"], report["epochs"]
    per_epoch = steps // epochs
    ckpt_steps = {s for s in range(1, steps + 1) if s % every == 0 or s % per_epoch == 0 or s == steps}
    faults = sorted((r["fired_step"] if r["mode"] == "save" else r["scheduled_step"], r["mode"])
                    for r in report["faults"] if r.get("fired"))
    # a node back (after ``node`` or ``drain``): the group grows, a restart from the last checkpoint
    faults += [(r["readded_step"], "grow") for r in report["faults"] if r.get("readded_step") is not None]
    faults.sort()
    recovery = costs.recovery_s(1)
    # the checkpoint cost from the measured blocking time over the checkpoints this schedule takes
    t = productive = lost = 0.0
    n_ckpt, s, last, pending = 0, 0, 0, list(faults)
    restarts = 0
    while s < steps:
        s += 1
        t += costs.step_s
        productive += costs.step_s
        due = [f for f in pending if f[0] == s and f[1] in ("exit", "raise", "node", "driver", "grow")]
        drain = [f for f in pending if f[0] == s and f[1] == "drain"]
        if s in ckpt_steps or drain:  # a drain: the just-in-time checkpoint, then the restart (nothing lost)
            save = [f for f in pending if f[1] == "save" and f[0] == s]
            n_ckpt += 1
            if save:  # dies between writing its part and reporting: the checkpoint is lost with the work
                due = due or save
            else:
                last = s
            due = due or drain
        if due:
            pending.remove(due[0])
            lost_steps = s - last
            productive -= lost_steps * costs.step_s
            lost += lost_steps * costs.step_s + recovery
            t += recovery
            restarts += 1
            s = last
    c = extra["blocking_s"] / n_ckpt if costs is measured_costs and n_ckpt else costs.checkpoint_s
    wall = costs.startup_s + t + n_ckpt * c + costs.teardown_end_s
    measured = report["totals"]["goodput"]
    return {"predicted_goodput_pct": round(100 * productive / wall, 3),
            "measured_goodput_pct": round(100 * measured["goodput_ratio"], 3),
            "predicted_wall_s": round(wall, 2), "measured_wall_s": round(measured["wall_s"], 2),
            "predicted_restarts": restarts, "measured_restarts": report["totals"]["restarts"],
            "predicted_lost_s": round(lost, 2), "measured_restart_lost_s": round(measured["restart_lost_s"], 2),
            "checkpoints": n_ckpt, "checkpoint_cost_s": round(c, 4), "recovery_s": round(recovery, 2),
            "step_s": round(costs.step_s, 4), "startup_s": round(costs.startup_s, 2)}


# ------------------------------------------------------------------------------------------------ output


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(result["scales"]), figsize=(5 * len(result["scales"]), 3.8), squeeze=False)
    step = result["costs"]["step_s"]
    for ax, row in zip(axes[0], result["scales"], strict=True):
        ks, gs = zip(*row["curve"], strict=True)
        ax.semilogx([k * step for k in ks], gs, ".-", color="0.4", label="fixed interval")
        ax.axvline(row["best_every_steps"] * step, color="tab:green", ls="--",
                   label=f"best {row['best_goodput_pct']:.2f} %")
        ax.axvline(row["auto_every_steps_final_median"] * step, color="tab:red", ls=":",
                   label=f"auto {row['auto_goodput_pct']:.2f} %")
        ax.set_title(f"{row['gpus']:,} GPUs ({row['failures_mean']:.1f} failures)")
        ax.set_xlabel("checkpoint interval (s of training)")
        ax.set_ylim(max(0.0, row["best_goodput_pct"] - 3.0), 100.05)  # the optimum's neighbourhood
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("goodput (%)")
    fig.suptitle(f"{result['trace']} failures, {result['days']:g} days, {result['replicas']} traces")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, Costs]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", default=",".join(map(str, SCALES)), help="comma-separated GPU counts")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--trace", choices=("llama3", "poisson", "file"), default="llama3")
    p.add_argument("--mtbf-node-s", type=float, default=None, help="poisson: each node's MTBF (llama3: its rate)")
    p.add_argument("--failures", help="--trace file: failure times in seconds, whitespace-separated")
    p.add_argument("--days", type=float, default=7.0, help="wall simulated per run")
    p.add_argument("--replicas", type=int, default=8, help="failure traces per scale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fixed", default="10,100,1000,10000", help="fixed intervals to report (steps)")
    p.add_argument("--plot", help="write the PNG here")
    p.add_argument("--campaign", help="a bench/chaos.py report: predict its goodput instead")
    c = Costs()
    for name in ("startup_s", "step_s", "checkpoint_s", "teardown_end_s"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(c, name))
    for name in PHASES:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=c.phases[name], help="recovery phase")
    p.add_argument("--growth", action="append", default=[], metavar="PHASE=LAW", help="const | log | linear")
    args = p.parse_args(argv)
    try:
        args.gpus = [int(g) for g in args.gpus.split(",") if g]
        args.fixed = [int(k) for k in args.fixed.split(",") if k]
    except ValueError as e:
        p.error(f"--gpus/--fixed: {e}")
    if args.trace == "llama3":
        args.mtbf_node_s = LLAMA3_NODE_MTBF_S
    elif args.trace == "poisson" and not args.mtbf_node_s:
        p.error("--trace poisson needs --mtbf-node-s")
    elif args.trace == "file" and not args.failures:
        p.error("--trace file needs --failures")
    growth = dict(GROWTH)
    for g in args.growth:
        phase, _, law = g.partition("=")
        if phase not in PHASES or law not in ("const", "log", "linear"):
            p.error(f"--growth: bad {g!r} (PHASE=const|log|linear, PHASE one of {', '.join(PHASES)})")
        growth[phase] = law
    costs = replace(c, **{n: getattr(args, n) for n in ("startup_s", "step_s", "checkpoint_s", "teardown_end_s")},
                    phases={n: getattr(args, n) for n in PHASES}, growth=growth)
    return args, costs


def main(argv: list[str] | None = None) -> int:
    args, costs = parse(argv)
    if args.campaign:
        print(json.dumps(predict_campaign(json.loads(Path(args.campaign).read_text())), indent=2))
        return 0
    result = at_scale(args, costs)
    if args.plot:
        plot(result, Path(args.plot))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
