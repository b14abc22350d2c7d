"""A sweep's results: one ranked row per trial, the best trial, and where they go (console lines and table,
results.csv, sweep.png, the parent tracking run with its children, best config, checkpoint and model).

**Best means one thing.** A trial's best is its retained checkpoint with the best ``sweep.metric`` (by
``sweep.mode``; a tie goes to the earlier checkpoint), as that checkpoint's meta.json records it: its value, epoch
and step. Trials keep that checkpoint because a sweep's ``checkpoint.score`` follows ``sweep.metric``
(:func:`~elastic_train.sweep.tuner.resolved_base`). The sweep's best is the trial whose best is best
(:func:`rank_rows`); the summary, the console, results.csv, the parent run's tags and metric, best_config.yaml,
``best_checkpoint/`` and the registered model all take it from :func:`best_row`. A trial's *last* report is never
used for ranking (it is what Tune's own table would show, so that table is off: ``verbose=0``).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.config import JobConfig
from elastic_train.launch.storage import RunStorage
from elastic_train.launch.summary import log_checkpoint_model
from elastic_train.sweep.plan import TUNE_PREFIX, SweepPlan, trial_run_name
from tracking import backend_for


@dataclass
class TrialRow:
    trial_id: str
    run_name: str
    config: dict[str, Any]
    status: str  # FINISHED | STOPPED (early, by the scheduler) | FAILED | UNFINISHED (sweep interrupted)
    best_metric: float | None  # the best checkpoint's value of sweep.metric (the one rule: module docstring)
    epochs: int
    history: list[tuple[float, float]] = field(default_factory=list)  # (epoch, metric) per report
    checkpoint: str | None = None  # the best checkpoint
    mlflow_run_id: str | None = None
    error: str | None = None
    best_epoch: float | None = None  # the best checkpoint's completed epochs
    best_step: int | None = None  # ... and global step
    world_sizes: list[int] = field(default_factory=list)  # every world size the trial trained at, in order
    restarts: int = 0  # worker-group restarts (failures and resizes) within the trial
    # The hyperparameter schedule of its latest weights (RunRecord.schedule): a PBT clone's starts with its donor's
    schedule: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "history"}


# ---------------------------------------------------------------------------------------- the rule


@dataclass(frozen=True)
class CheckpointScore:
    """One retained checkpoint of a trial, as its meta.json describes it."""

    uri: str
    value: float | None  # sweep.metric; None when the checkpoint does not carry it
    epoch: float | None = None
    step: int | None = None


def is_better(value: float, than: float | None, mode: str) -> bool:
    """Whether ``value`` beats ``than`` (None: nothing to beat) under ``mode`` (min | max); ties do not."""
    return than is None or (value < than if mode == "min" else value > than)


def pick_best(scores: Iterable[CheckpointScore], mode: str) -> CheckpointScore | None:
    """The best-scoring checkpoint (oldest first in, so a tie keeps the earlier one); None if none is scored."""
    best: CheckpointScore | None = None
    for score in scores:
        if score.value is not None and is_better(score.value, best.value if best else None, mode):
            best = score
    return best


def rank_rows(rows: list[TrialRow], mode: str) -> list[TrialRow]:
    """Trials best first by their best checkpoint; trials without one last (in their given order)."""
    sign = 1 if mode == "min" else -1
    return sorted(rows, key=lambda r: (r.best_metric is None, sign * r.best_metric if r.best_metric is not None
                                       else 0.0))


def best_row(rows: list[TrialRow], mode: str) -> TrialRow | None:
    """The sweep's best trial: the first of :func:`rank_rows` that has a best checkpoint."""
    return next((r for r in rank_rows(rows, mode) if r.best_metric is not None), None)


def score_of(uri: str, meta: dict[str, Any], metric: str) -> CheckpointScore:
    """A checkpoint's score from its meta.json (``metrics`` holds the report it was saved with)."""
    m = meta.get("metrics") or {}
    value = m.get(metric)
    step = m.get("global_step", (meta.get("progress") or {}).get("global_step"))
    return CheckpointScore(uri, float(value) if isinstance(value, int | float) else None,
                           m.get("epoch"), int(step) if isinstance(step, int | float) else None)


@dataclass(frozen=True)
class TrialCheckpoints:
    """What a trial's retained checkpoints say: its best, and (from the latest) its world sizes and restarts."""

    best: CheckpointScore | None
    latest: str | None
    world_sizes: list[int]
    restarts: int
    epochs: int  # completed epochs at the latest checkpoint
    schedule: list[dict[str, Any]] = field(default_factory=list)  # the latest weights' hyperparameter schedule


def read_trial(storage: RunStorage, metric: str, mode: str) -> TrialCheckpoints:
    """Read every retained checkpoint's meta.json of one trial once."""
    metas = [(storage.uri(n), json.loads(storage.read_text(f"{n}/meta.json") or "{}")) for n in storage.checkpoints()]
    if not metas:
        return TrialCheckpoints(None, None, [], 0, 0)
    latest_uri, latest = metas[-1]
    m = latest.get("metrics") or {}
    return TrialCheckpoints(
        best=pick_best((score_of(u, meta, metric) for u, meta in metas), mode),
        latest=latest_uri,
        world_sizes=[int(w) for w in latest.get("world_sizes") or []],
        restarts=int(m.get("restarts", 0) or 0),
        epochs=int((latest.get("progress") or {}).get("epoch", m.get("epoch", 0)) or 0),
        schedule=list(latest.get("schedule") or []),
    )


def best_checkpoint(storage: RunStorage, metric: str, mode: str) -> str | None:
    """The trial's retained checkpoint with the best ``metric`` (their meta.json says), else its latest."""
    seen = read_trial(storage, metric, mode)
    return seen.best.uri if seen.best else seen.latest


# ---------------------------------------------------------------------------------------- collect


# Each trial's status as Tune last saw it (``TERMINATED`` for one ASHA stopped or that finished, ``ERROR``), noted by
# a Tune callback (progress.TrialStatuses): a Result does not say whether its trial was stopped or left running.
TRIAL_STATUSES: dict[str, str] = {}


def collect_trials(plan: SweepPlan, grid: Any) -> list[TrialRow]:
    """One row per trial from Tune's results and the trial's checkpoints, ranked best first."""
    s = plan.cfg.sweep
    # Tune's own view tells a trial stopped by ASHA (TERMINATED) from one an interrupted sweep left RUNNING: a
    # trial it never saw end is live.
    ended = {tid for tid, status in TRIAL_STATUSES.items() if status in ("TERMINATED", "ERROR")}
    rows = []
    for result in grid:
        trial_id = Path(result.path).name.removeprefix(TUNE_PREFIX)
        df = result.metrics_dataframe
        history: list[tuple[float, float]] = []
        if df is not None and s.metric in df and "epoch" in df:
            history = [(float(e), float(m)) for e, m in zip(df["epoch"], df[s.metric], strict=True) if m == m]
        seen = read_trial(RunStorage(plan.sweep_dir, trial_run_name(trial_id)), s.metric, s.mode)
        reported = int(max((e for e, _ in history), default=0))
        # A trial Tune ended trained what it reported: a stopped trial's Train run may write a checkpoint after the
        # stop (its workers end a moment after its controller), which is no epoch of the trial's.
        done = reported if trial_id in ended and history else max(reported, seen.epochs)
        if result.error is not None:
            status = "FAILED"
        elif trial_id not in ended or not history:
            status = "UNFINISHED"
        else:
            status = "FINISHED" if done >= _trial_epochs(plan.cfg, result.config) else "STOPPED"
        error = str(result.error).strip().splitlines()[-1][:300] if result.error is not None else None
        best = seen.best
        rows.append(TrialRow(
            trial_id, trial_run_name(trial_id), dict(result.config), status, best.value if best else None, done,
            history, checkpoint=best.uri if best else seen.latest, error=error,
            best_epoch=best.epoch if best else None, best_step=best.step if best else None,
            world_sizes=seen.world_sizes, restarts=seen.restarts, schedule=seen.schedule,
        ))
    return rank_rows(rows, s.mode)


def _trial_epochs(cfg: JobConfig, overrides: dict[str, Any]) -> int:
    return int(overrides.get("train.epochs", cfg.train.epochs))


def trial_line(row: TrialRow, metric: str) -> str:
    """One console line for a trial that ended, by the same rule as the final table."""
    values = " ".join(f"{k}={_fmt(v)}" for k, v in sorted(row.config.items()))
    best = (f"best {metric} {_fmt(row.best_metric)} (epoch {_fmt(row.best_epoch)}, step {_fmt(row.best_step)})"
            if row.best_metric is not None else f"no {metric} checkpoint")
    sizes = "->".join(map(str, row.world_sizes)) or "-"
    return (f"trial {row.trial_id} {row.status}: {row.epochs} epochs, {best}; world sizes {sizes}, "
            f"restarts {row.restarts}; {values}")


class TrialLines:
    """A Tune callback: one line per trial as it ends (Tune's own table is off; it ranks by the last report).

    Picklable (Tune saves its callbacks with the experiment): it holds the sweep folder and config, nothing live.
    """

    def __init__(self, sweep_dir: str, cfg: JobConfig) -> None:
        self.sweep_dir, self.cfg = sweep_dir, cfg

    def row(self, trial: Any, failed: bool) -> TrialRow:
        s = self.cfg.sweep
        seen = read_trial(RunStorage(self.sweep_dir, trial_run_name(trial.trial_id)), s.metric, s.mode)
        budget = _trial_epochs(self.cfg, dict(trial.config or {}))
        status = "FAILED" if failed else "FINISHED" if seen.epochs >= budget else "STOPPED"
        best = seen.best
        return TrialRow(trial.trial_id, trial_run_name(trial.trial_id), dict(trial.config or {}), status,
                        best.value if best else None, seen.epochs, checkpoint=best.uri if best else seen.latest,
                        best_epoch=best.epoch if best else None,
                        best_step=best.step if best else None, world_sizes=seen.world_sizes, restarts=seen.restarts)

    def _print(self, trial: Any, failed: bool) -> None:
        try:
            print(trial_line(self.row(trial, failed), self.cfg.sweep.metric), file=sys.stdout, flush=True)
        except Exception as e:  # the sweep ran; a model upload failure is reported, not fatal
            print(f"trial {trial.trial_id}: {'FAILED' if failed else 'ended'} ({type(e).__name__}: {e})",
                  flush=True)

    # Tune's Callback hooks (elastic_train.sweep.progress makes this a ray.tune.Callback)
    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._print(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._print(trial, failed=True)


# ---------------------------------------------------------------------------------------- MLflow


def close_children(plan: SweepPlan, rows: list[TrialRow]) -> None:
    """Give each trial's child run its sweep outcome and a terminal status.

    Trials stopped by the scheduler were ended mid-run (their process is gone): they are marked FINISHED with
    ``stopped_early=true``, as Ray's own MLflow callback marks early-stopped trials.
    """
    parent = plan.ctx.tracking
    if parent is None:
        return
    backend = backend_for(parent, plan.ctx.home)
    metric = plan.cfg.sweep.metric
    by_name = {c.name: c for c in backend.child_runs(parent)}
    for row in rows:
        child = by_name.get(row.run_name)
        if child is None:
            continue
        row.mlflow_run_id = child.run_id
        spec = replace(parent, run_id=child.run_id)
        writer = backend.writer(spec)
        writer.log_metrics({"epochs_run": row.epochs,
                            **({f"best_{metric}": row.best_metric} if row.best_metric is not None else {})}, step=0)
        writer.set_tags({"sweep_status": row.status, "stopped_early": str(row.status == "STOPPED").lower(),
                         "world_sizes": row.world_sizes, "restarts": row.restarts,
                         "best_epoch": _fmt(row.best_epoch), "best_step": _fmt(row.best_step),
                         **({"hp_schedule": json.dumps(row.schedule)} if row.schedule else {})})
        writer.close(timeout_s=30)
        status = {"FAILED": "FAILED", "UNFINISHED": "KILLED"}.get(row.status, "FINISHED")
        if child.status != status:
            backend.end_run(spec, status)


def end_parent(plan: SweepPlan, status: str) -> None:
    """Mark the sweep's parent run (an interrupted sweep: KILLED)."""
    if plan.ctx.tracking is not None:
        backend_for(plan.ctx.tracking, plan.ctx.home).end_run(plan.ctx.tracking, status)


def finish_parent(plan: SweepPlan, summary: dict[str, Any], rows: list[TrialRow]) -> None:
    """Results table, plot, best trial's config, checkpoint and model (registered if asked) into the parent run."""
    import yaml

    parent = plan.ctx.tracking
    if parent is None:
        return
    backend = backend_for(parent, plan.ctx.home)
    best = summary["best"]
    with tempfile.TemporaryDirectory(prefix="sweep-") as tmp:
        out = Path(tmp)
        write_results_csv(rows, plan.cfg, out / "results.csv")
        try:
            plot_sweep(rows, plan.cfg, out / "sweep.png")
        except Exception as e:  # the sweep ran; a model upload failure is reported, not fatal
            summary["plot_error"] = f"{type(e).__name__}: {e}"
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if best:
            best_cfg = config_mod.with_overrides(plan.cfg, {**best["config"], "name": None})
            (out / "best_config.yaml").write_text(yaml.safe_dump(best_cfg.model_dump(mode="json"), sort_keys=False))
        backend.log_artifacts(parent, tmp)
    if best and best.get("checkpoint"):
        from ray.train import Checkpoint

        with Checkpoint(best["checkpoint"]).as_directory() as d:
            backend.log_artifacts(parent, d, artifact_path="best_checkpoint")
        try:
            best.update(log_checkpoint_model(plan.ctx, parent, best["checkpoint"]))
        except Exception as e:  # the sweep ran; a model upload failure is reported, not fatal
            best["model_error"] = f"{type(e).__name__}: {e}"
    metrics = {"total_epochs": summary["total_epochs"], "trials": len(rows), "wall_s": summary["wall_s"],
               "trials_stopped_early": sum(r.status == "STOPPED" for r in rows),
               "trials_failed": sum(r.status == "FAILED" for r in rows)}
    if best:
        metrics[f"best_{plan.cfg.sweep.metric}"] = best["metric"]
    writer = backend.writer(parent)
    writer.log_metrics(metrics, step=0)
    best = best or {}
    writer.set_tags({"best_trial": best.get("trial_id", "-"), "best_run_id": best.get("mlflow_run_id") or "-",
                     "best_value": _fmt(best.get("metric")), "best_epoch": _fmt(best.get("epoch")),
                     "best_step": _fmt(best.get("step")), "best_checkpoint": best.get("checkpoint") or "-",
                     "best_rule": f"best checkpoint by {plan.cfg.sweep.metric} ({plan.cfg.sweep.mode})"})
    writer.close(timeout_s=60)
    backend.end_run(parent, summary["status"])


# ---------------------------------------------------------------------------------------- summary


def summarize(plan: SweepPlan, rows: list[TrialRow], reclaimed: list[str], limit: int | None) -> dict[str, Any]:
    from elastic_train.sweep.placement_groups import scan_totals

    s, parent = plan.cfg.sweep, plan.ctx.tracking
    top = best_row(rows, s.mode)
    best = None
    if top is not None:
        best = {"trial_id": top.trial_id, "run_name": top.run_name, "config": top.config, "metric": top.best_metric,
                "epoch": top.best_epoch, "step": top.best_step, "rule": "best checkpoint",
                "checkpoint": top.checkpoint, "mlflow_run_id": top.mlflow_run_id, "epochs": top.epochs,
                "world_sizes": top.world_sizes, "restarts": top.restarts}
    return {
        "sweep": plan.name,
        "status": "KILLED" if any(r.status == "UNFINISHED" for r in rows) else "FINISHED" if best else "FAILED",
        "metric": s.metric,
        "mode": s.mode,
        "search": s.search,
        "scheduler": s.scheduler,
        "max_concurrent_trials": limit,
        "trials": [r.to_dict() for r in rows],
        "best": best,
        "total_epochs": sum(r.epochs for r in rows),
        "wall_s": time.time() - plan.ctx.started,
        "storage_path": plan.sweep_dir,
        "mlflow_parent_run_id": parent.run_id if parent else None,
        "tracking_uri": parent.uri if parent else None,
        "placement_groups_reclaimed": len(reclaimed),
        # the reaper's scans of the GCS (feature sweep_reaper; none without it): how many, and their seconds
        "placement_group_scans": scan_totals(),
    }


def account(plan: SweepPlan, summary: dict[str, Any]) -> None:
    """``wall_s`` as of now and ``phases``: where the sweep driver's wall went (they add up to it)."""
    from elastic_train.launch import timeline

    summary["wall_s"] = time.time() - plan.ctx.started
    tl = timeline.current()
    if tl is not None and tl.launched == plan.ctx.started:
        summary["phases"] = {name: round(secs, 2) for name, secs in tl.phases()}
        summary["phases"]["table"] = round(time.time() - tl.last, 2)


def render_table(summary: dict[str, Any]) -> str:
    """The ranked trials, best first, as the console's last word."""
    trials = summary["trials"]
    keys = sorted({k for t in trials for k in t["config"]})
    head = ["#", "trial", "status", "epochs", f"best_{summary['metric']}", "at_epoch", "world_sizes", "restarts",
            *keys]
    body = [[str(i + 1), t["trial_id"], t["status"], str(t["epochs"]), _fmt(t["best_metric"]),
             _fmt(t.get("best_epoch")), "->".join(map(str, t.get("world_sizes") or [])) or "-",
             str(t.get("restarts", 0)), *(_fmt(t["config"].get(k)) for k in keys)] for i, t in enumerate(trials)]
    widths = [max(len(r[c]) for r in [head, *body]) for c in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [head, *body]]
    best = summary["best"]
    foot = [f"best: {best['trial_id']} {summary['metric']}={_fmt(best['metric'])} at epoch {_fmt(best.get('epoch'))}"
            f" (its best checkpoint) {best['config']}",
            f"      checkpoint {best['checkpoint'] or '-'}", f"      mlflow run {best['mlflow_run_id'] or '-'}"] \
        if best else ["best: none (every trial failed)"]
    rule = "=" * max(72, len(lines[0]))
    tail = [f"sweep {summary['sweep']}: {len(trials)} trials, "
            f"{summary['total_epochs']} epochs in {summary['wall_s']:.0f} s;"
            f" parent run {summary['mlflow_parent_run_id'] or 'off'}"]
    shown = [(k, v) for k, v in (summary.get("phases") or {}).items() if v >= 0.05]
    if shown:
        tail.append("  phases: " + ", ".join(f"{k} {v:.1f}" for k, v in shown) + " s")
    return "\n".join([rule, *lines, rule, *foot, *tail])


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_results_csv(rows: list[TrialRow], cfg: JobConfig, path: Path) -> None:
    import csv

    keys = sorted({k for r in rows for k in r.config})
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            ["rank", "trial_id", "status", "epochs", f"best_{cfg.sweep.metric}", "best_epoch", "best_step",
             "world_sizes", "restarts", *keys, "lr_schedule", "batch_schedule", "cloned_from", "mlflow_run_id",
             "checkpoint"]
        )
        for i, r in enumerate(rows):
            w.writerow([i + 1, r.trial_id, r.status, r.epochs, r.best_metric, r.best_epoch, r.best_step,
                        " ".join(map(str, r.world_sizes)), r.restarts, *(r.config.get(k) for k in keys),
                        schedule_column(r.schedule, "lr"), schedule_column(r.schedule, "global_batch_size"),
                        " ".join(f"{e['cloned_from']}@{e['step']}" for e in r.schedule if e.get("cloned_from")),
                        r.mlflow_run_id, r.checkpoint])


def schedule_column(schedule: list[dict[str, Any]], key: str) -> str:
    """A schedule as ``step:value`` pairs where ``key`` changes (the first always): ``0:0.01 11:0.012``."""
    out, last = [], object()
    for e in schedule:
        if e.get(key) != last:
            out.append(f"{e['step']}:{_fmt(e.get(key))}")
            last = e.get(key)
    return " ".join(out)


def plot_sweep(rows: list[TrialRow], cfg: JobConfig, path: Path) -> None:
    """Write :func:`sweep_figure` to ``path`` (PNG)."""
    import matplotlib.pyplot as plt

    fig = sweep_figure(rows, cfg)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _number(v: Any) -> Any:
    """A trial value as a number when it is one (a config stored before ``1e-3`` parsed as a float)."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def sweep_figure(rows: list[TrialRow], cfg: JobConfig) -> Any:
    """Left: each trial's best metric against the learning rate, coloured by global batch size (a numeric
    axis, log-scaled for lr and loguniform keys). Right: every trial's learning curve (metric per epoch),
    same colours; stopped trials dashed. Under PBT a third panel: each trial's learning-rate schedule over global
    steps (its latest weights', a clone's starting with its donor's). Returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = cfg.sweep.metric
    x_key = "train.lr" if "train.lr" in cfg.sweep.space else next(iter(cfg.sweep.space), None)
    c_key = "train.global_batch_size"
    colours = sorted({r.config.get(c_key, cfg.train.global_batch_size) for r in rows},
                     key=lambda v: (not isinstance(v, int | float), v if isinstance(v, int | float) else str(v)))
    cmap = plt.get_cmap("viridis", max(len(colours), 2))
    colour = {v: cmap(i) for i, v in enumerate(colours)}
    pbt = cfg.sweep.scheduler == "pbt"
    fig, axes = plt.subplots(1, 3 if pbt else 2, figsize=(18 if pbt else 12, 4.5))
    left, right = axes[0], axes[1]
    for v in colours:
        pts = [(_number(r.config.get(x_key)), r.best_metric) for r in rows
               if r.best_metric is not None and r.config.get(c_key, cfg.train.global_batch_size) == v]
        if pts:
            left.scatter(*zip(*pts, strict=True), color=colour[v], label=f"batch {v}", s=36)
    if x_key == "train.lr" or (x_key and cfg.sweep.space[x_key].type == "loguniform"):
        left.set_xscale("log")
    left.set(xlabel=x_key or "-", ylabel=f"best {metric}", title=f"{metric} by trial")
    left.legend(fontsize=8)
    for r in rows:
        if r.history:
            e, m = zip(*r.history, strict=True)
            right.plot(e, m, color=colour[r.config.get(c_key, cfg.train.global_batch_size)],
                       linestyle="--" if r.status == "STOPPED" else "-", alpha=0.8, marker=".")
    right.set(xlabel="epoch", ylabel=metric, title="learning curves (dashed: stopped early)")
    if pbt:
        _plot_schedules(axes[2], rows)
    fig.tight_layout()
    return fig


def _plot_schedules(ax: Any, rows: list[TrialRow]) -> None:
    """Each trial's learning rate against global step, as a step function (a clone's starts with its donor's)."""
    end = max([e["step"] for r in rows for e in r.schedule] + [r.best_step or 0 for r in rows] + [1])
    for r in rows:
        if r.schedule:
            steps = [e["step"] for e in r.schedule] + [max(end, r.schedule[-1]["step"])]
            lrs = [e["lr"] for e in r.schedule] + [r.schedule[-1]["lr"]]
            ax.plot(steps, lrs, drawstyle="steps-post", marker=".", alpha=0.8, label=r.trial_id)
    ax.set_yscale("log")
    ax.set(xlabel="global step", ylabel="train.lr", title="learning-rate schedules (PBT)")
    ax.legend(fontsize=7)
