"""A sweep's results: one ranked row per trial, the best trial, and where they go (console table, results.csv,
sweep.png, the parent tracking run with its children, best config, checkpoint and model)."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.config import JobConfig
from elastic_train.launch.storage import RunStorage
from elastic_train.launch.summary import log_checkpoint_model
from elastic_train.sweep.plan import SweepPlan
from elastic_train.sweep.tuner import TUNE_PREFIX, trial_run_name
from tracking import backend_for


@dataclass
class TrialRow:
    trial_id: str
    run_name: str
    config: dict[str, Any]
    status: str  # FINISHED | STOPPED (early, by the scheduler) | FAILED | UNFINISHED (sweep interrupted)
    best_metric: float | None
    epochs: int
    history: list[tuple[float, float]] = field(default_factory=list)  # (epoch, metric) per report
    checkpoint: str | None = None
    mlflow_run_id: str | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "history"}


def collect_trials(plan: SweepPlan, grid: Any) -> list[TrialRow]:
    """One row per trial from Tune's results, ranked best first (failed and unrun trials last)."""
    s = plan.cfg.sweep
    # Tune's own view tells a trial stopped by ASHA (TERMINATED) from one an interrupted sweep left RUNNING.
    live = {t.trial_id for t in grid._experiment_analysis.trials if t.status not in ("TERMINATED", "ERROR")}
    rows = []
    for result in grid:
        trial_id = Path(result.path).name.removeprefix(TUNE_PREFIX)
        df = result.metrics_dataframe
        history: list[tuple[float, float]] = []
        if df is not None and s.metric in df and "epoch" in df:
            history = [(float(e), float(m)) for e, m in zip(df["epoch"], df[s.metric], strict=True) if m == m]
        values = [m for _, m in history]
        best = (min(values) if s.mode == "min" else max(values)) if values else None
        done = int(max((e for e, _ in history), default=0))
        if result.error is not None:
            status = "FAILED"
        elif trial_id in live or not history:
            status = "UNFINISHED"
        else:
            status = "FINISHED" if done >= _trial_epochs(plan.cfg, result.config) else "STOPPED"
        error = str(result.error).strip().splitlines()[-1][:300] if result.error is not None else None
        rows.append(TrialRow(trial_id, trial_run_name(trial_id), dict(result.config), status, best, done, history,
                             error=error))
    sign = 1 if s.mode == "min" else -1
    rows.sort(key=lambda r: (r.best_metric is None, sign * r.best_metric if r.best_metric is not None else 0.0))
    for row in rows:
        row.checkpoint = best_checkpoint(RunStorage(plan.sweep_dir, row.run_name), s.metric, s.mode)
    return rows


def _trial_epochs(cfg: JobConfig, overrides: dict[str, Any]) -> int:
    return int(overrides.get("train.epochs", cfg.train.epochs))


def best_checkpoint(storage: RunStorage, metric: str, mode: str) -> str | None:
    """The trial's retained checkpoint with the best ``metric`` (their meta.json says), else its latest."""

    best, best_value = None, None
    for name in storage.checkpoints():
        value = json.loads(storage.read_text(f"{name}/meta.json") or "{}").get("metrics", {}).get(metric)
        if not isinstance(value, int | float):
            continue
        if best_value is None or (value < best_value if mode == "min" else value > best_value):
            best, best_value = name, value
    if best is None:
        latest = storage.latest_checkpoint()
        return latest[0] if latest else None
    return storage.uri(best)


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
        writer.set_tags({"sweep_status": row.status, "stopped_early": str(row.status == "STOPPED").lower()})
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
        except Exception as e:  # noqa: BLE001 - a plot is a nicety; the table holds the same numbers
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
        except Exception as e:  # noqa: BLE001 - the sweep ran; a model upload failure is reported, not fatal
            best["model_error"] = f"{type(e).__name__}: {e}"
    metrics = {"total_epochs": summary["total_epochs"], "trials": len(rows), "wall_s": summary["wall_s"],
               "trials_stopped_early": sum(r.status == "STOPPED" for r in rows),
               "trials_failed": sum(r.status == "FAILED" for r in rows)}
    if best:
        metrics[f"best_{plan.cfg.sweep.metric}"] = best["metric"]
    writer = backend.writer(parent)
    writer.log_metrics(metrics, step=0)
    writer.set_tags({"best_trial": best.get("trial_id", "-") if best else "-",
                     "best_run_id": (best or {}).get("mlflow_run_id") or "-"})
    writer.close(timeout_s=60)
    backend.end_run(parent, summary["status"])


# ---------------------------------------------------------------------------------------- summary


def summarize(plan: SweepPlan, rows: list[TrialRow], reclaimed: list[str], limit: int | None) -> dict[str, Any]:
    s, parent = plan.cfg.sweep, plan.ctx.tracking
    best_row = next((r for r in rows if r.best_metric is not None), None)
    best = None
    if best_row is not None:
        best = {"trial_id": best_row.trial_id, "config": best_row.config, "metric": best_row.best_metric,
                "checkpoint": best_row.checkpoint, "mlflow_run_id": best_row.mlflow_run_id, "epochs": best_row.epochs}
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
    }


def render_table(summary: dict[str, Any]) -> str:
    """The ranked trials, best first, as the console's last word."""
    trials = summary["trials"]
    keys = sorted({k for t in trials for k in t["config"]})
    head = ["#", "trial", "status", "epochs", summary["metric"], *keys]
    body = [[str(i + 1), t["trial_id"], t["status"], str(t["epochs"]), _fmt(t["best_metric"]),
             *(_fmt(t["config"].get(k)) for k in keys)] for i, t in enumerate(trials)]
    widths = [max(len(r[c]) for r in [head, *body]) for c in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in [head, *body]]
    best = summary["best"]
    foot = [f"best: {best['trial_id']} {summary['metric']}={_fmt(best['metric'])} {best['config']}",
            f"      checkpoint {best['checkpoint'] or '-'}", f"      mlflow run {best['mlflow_run_id'] or '-'}"] \
        if best else ["best: none (every trial failed)"]
    rule = "=" * max(72, len(lines[0]))
    tail = [f"sweep {summary['sweep']}: {len(trials)} trials, "
            f"{summary['total_epochs']} epochs in {summary['wall_s']:.0f} s;"
            f" parent run {summary['mlflow_parent_run_id'] or 'off'}"]
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
            ["rank", "trial_id", "status", "epochs", f"best_{cfg.sweep.metric}", *keys, "mlflow_run_id", "checkpoint"]
        )
        for i, r in enumerate(rows):
            w.writerow([i + 1, r.trial_id, r.status, r.epochs, r.best_metric, *(r.config.get(k) for k in keys),
                        r.mlflow_run_id, r.checkpoint])


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
    same colours; stopped trials dashed. Returns the matplotlib Figure."""
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
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
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
    fig.tight_layout()
    return fig
