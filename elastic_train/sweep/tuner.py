"""Ray Tune sweeps: every trial is the elastic multi-worker run ``jobs.train`` makes (DESIGN invariant 6).

    plan = plan_sweep(config_path, overrides, resume)     # config, space and name checked; no Ray yet
    report = driver.prepare(plan.launch, address)          # the base run's preflight (data, model, Ray, storage)
    limit = check_concurrency(plan.cfg, report)            # trials that fit at once; exit 2 if none can
    parent = start_parent(plan, report)                    # the sweep's MLflow parent run (created or found)
    grid, reaper = run_tuner(plan, report, parent, limit)  # Tuner(...).fit() or Tuner.restore(...).fit()
    summary = summarize(plan, grid, parent, reaper)        # ranked trials, the best one, epochs spent
    finish_parent(plan, summary, parent, report)           # results.csv, sweep.png, best config/checkpoint/model

A trial (:func:`run_trial`) applies its overrides to the job config and runs ``driver.fit`` -- the one
``build_trainer(cfg).fit()`` -- inside a Tune function trainable, with Ray's ``TuneReportCallback`` passing
every checkpoint report on to Tune. Workers report at checkpoint cadence and every report carries ``epoch``
(completed epochs), so ASHA's time attribute is ``epoch``: extra mid-epoch reports repeat the epoch of the
rung already recorded and change nothing.

Layout under ``checkpoint.storage_path``::

    <sweep name>/                       Tune's experiment (tuner.pkl, experiment_state-*.json)
        elastic_train_config.json       the sweep's resolved config (``--resume NAME`` starts from it)
        tune-<trial id>/                Tune's trial folder (result.json, progress.csv)
        trial-<trial id>/               the trial's Ray Train run: checkpoints, snapshot (a restart resumes it)
"""

from __future__ import annotations

import copy
import difflib
import importlib.util
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.config import SCORE_METRICS, ConfigError, Distribution, JobConfig
from elastic_train.launch import run as driver
from elastic_train.launch.storage import RunStorage

log = logging.getLogger(__name__)

# Keys a trial may not change: they name the sweep, its storage or its tracking, or are the sweep itself.
UNSWEEPABLE = ("sweep.", "tracking.", "name", "checkpoint.storage_path")
TRIAL_PREFIX, TUNE_PREFIX = "trial-", "tune-"


class TrialFailed(RuntimeError):
    """A trial's run ended FAILED after its own failure budget (``failure.max_failures``)."""


# ---------------------------------------------------------------------------------------- plan


@dataclass
class SweepPlan:
    launch: driver.Launch  # the sweep's: base config (+ sweep section), run name = sweep name, storage
    restoring: bool  # a Tune experiment of this name exists: continue it (Tuner.restore)

    @property
    def cfg(self) -> JobConfig:
        return self.launch.cfg

    @property
    def name(self) -> str:
        return self.launch.run_name

    @property
    def sweep_dir(self) -> str:
        return RunStorage(self.launch.storage_path, self.name).uri()


def plan_sweep(config_path: str | None, overrides: list[str], resume: str | None = None) -> SweepPlan:
    """Resolve and check the sweep without Ray. ``--resume NAME`` (or a reused ``name``) continues that sweep."""
    launch = driver.plan_launch(config_path, overrides, resume)
    validate_sweep(launch.cfg)
    launch.resuming = False  # the sweep folder holds no checkpoints of its own; its trials do
    plan = SweepPlan(launch, restoring=False)
    plan.restoring = _tune_state_exists(plan.sweep_dir)
    if resume and not plan.restoring:
        log.warning("sweep %s has no Tune state yet (stopped before its first save): starting it again", resume)
    return plan


def _tune_state_exists(sweep_dir: str) -> bool:
    import pyarrow.fs

    fs, base = pyarrow.fs.FileSystem.from_uri(sweep_dir if "://" in sweep_dir else f"file://{sweep_dir}")
    return fs.get_file_info(f"{base.rstrip('/')}/tuner.pkl").type == pyarrow.fs.FileType.File


def validate_sweep(cfg: JobConfig) -> None:
    """Every mistake in the ``sweep`` section as a ConfigError naming the field, before anything starts."""
    s = cfg.sweep
    if s.metric not in SCORE_METRICS:
        raise ConfigError("sweep.metric", s.metric, f"not a reported metric; use one of {', '.join(SCORE_METRICS)}")
    if s.search == "optuna" and importlib.util.find_spec("optuna") is None:
        raise ConfigError("sweep.search", "optuna", "optuna is not installed: pip install 'elastic-train[optuna]'")
    if s.scheduler == "asha" and s.grace_period > cfg.train.epochs:
        raise ConfigError("sweep.grace_period", s.grace_period, f"longer than train.epochs={cfg.train.epochs}")
    known = config_mod.leaf_keys()
    for key, dist in s.space.items():
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigError("sweep.space", key, "unknown config key" + (f"; did you mean {hint[0]!r}?" if hint else ""))
        if key.startswith(UNSWEEPABLE):
            raise ConfigError("sweep.space", key, "cannot be swept (it names the sweep, its storage or tracking)")
        if key == "train.epochs" and s.scheduler == "asha":
            raise ConfigError("sweep.space", key, "asha's budget is train.epochs; do not sweep it (or use scheduler=none)")
        if s.search == "grid" and dist.type not in ("choice", "grid"):
            raise ConfigError(f"sweep.space.{key}", dist.type, "search=grid needs choice or grid values")
        if s.search == "optuna" and dist.type == "grid":
            raise ConfigError(f"sweep.space.{key}", dist.type, "optuna samples; use choice instead of grid")
        for value in probe_values(dist):
            try:
                config_mod.with_overrides(cfg, {key: value})
            except ConfigError as e:
                reason = e.reason if e.field == key else f"{e.field}={e.value!r}: {e.reason}"
                raise ConfigError(f"sweep.space.{key}", value, reason) from None


def probe_values(dist: Distribution) -> list[Any]:
    """Values that stand for the whole distribution when validating it: the candidates, or the ends and an inner point."""
    if dist.type in ("choice", "grid"):
        return list(dist.values or [])
    lo, hi = dist.low, dist.high
    if dist.type == "randint":
        return [int(lo), int(math.ceil(hi)) - 1]
    # An inner point off any round number: a float range on an integer key fails here, not in a trial.
    inner = lo * (hi / lo) ** 0.37 if dist.type == "loguniform" else lo + (hi - lo) * 0.37
    return [lo, inner, hi]


# ---------------------------------------------------------------------------------------- concurrency


def trial_need(cfg: JobConfig, use_gpu: bool) -> dict[str, float]:
    """What one trial holds at least: its driver's CPUs plus its minimum workers' resources."""
    from elastic_train.launch.trainer import worker_resources

    need = {"CPU": cfg.sweep.trial_cpus}
    for k, v in worker_resources(cfg, use_gpu).items():
        need[k] = need.get(k, 0.0) + v * cfg.scaling.min_workers
    return need


def trials_that_fit(need: dict[str, float], totals: dict[str, float]) -> int:
    """Trials the cluster holds at once: its total of each resource over one trial's need, the scarcest."""
    return min((math.floor(totals.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0), default=0)


def check_concurrency(cfg: JobConfig, report: Any, totals: dict[str, float] | None = None) -> int | None:
    """``sweep.max_concurrent_trials`` resolved against the cluster; ConfigError if it can never hold that many.

    Tune only sees each trial's driver (``sweep.trial_cpus``); the Train workers are placed later by the
    trial itself. Capping the trials in flight at what the cluster can hold keeps every started trial able
    to acquire its workers (otherwise trial drivers can take the CPUs their own workers need: a deadlock).
    """
    import ray

    totals = totals if totals is not None else ray.cluster_resources()
    need = _largest_need(cfg, report.use_gpu)
    fit = trials_that_fit(need, totals)
    have = {k: totals.get(k, 0.0) for k in need}
    requested = cfg.sweep.max_concurrent_trials
    if cfg.scaling.autoscaling:
        if fit < 1:
            report.warnings.append(f"no trial fits the cluster yet (each needs {need}); waiting for the autoscaler")
        return None if requested == "auto" else requested
    if fit < 1:
        raise ConfigError("sweep.trial_cpus", cfg.sweep.trial_cpus,
                          f"each trial needs {need} (its driver plus {cfg.scaling.min_workers} worker(s)); "
                          f"the cluster has {have}: no trial fits")
    if requested != "auto" and requested > fit:
        raise ConfigError("sweep.max_concurrent_trials", requested,
                          f"the cluster holds at most {fit} trial(s) at once (each needs {need}; it has {have})")
    return fit if requested == "auto" else requested


def _largest_need(cfg: JobConfig, use_gpu: bool) -> dict[str, float]:
    """The need of the hungriest trial the space can produce (only scaling.* keys change it)."""
    need = trial_need(cfg, use_gpu)
    for key, dist in cfg.sweep.space.items():
        if key.startswith("scaling.") and dist.type in ("choice", "grid"):
            for value in dist.values or []:
                for k, v in trial_need(config_mod.with_overrides(cfg, {key: value}), use_gpu).items():
                    need[k] = max(need.get(k, 0.0), v)
    return need


# ---------------------------------------------------------------------------------------- the Tuner


def tune_space(cfg: JobConfig) -> dict[str, Any]:
    """``sweep.space`` as a Tune param_space (flat, dotted keys); search=grid turns choices into grids."""
    from ray import tune

    out: dict[str, Any] = {}
    for key, d in cfg.sweep.space.items():
        if d.type == "grid" or (d.type == "choice" and cfg.sweep.search == "grid"):
            out[key] = tune.grid_search(list(d.values or []))
        elif d.type == "choice":
            out[key] = tune.choice(list(d.values or []))
        elif d.type == "loguniform":
            out[key] = tune.loguniform(d.low, d.high)
        elif d.type == "uniform":
            out[key] = tune.uniform(d.low, d.high)
        else:
            out[key] = tune.randint(int(d.low), int(math.ceil(d.high)))
    return out


def make_scheduler(cfg: JobConfig) -> Any | None:
    """ASHA on completed epochs, max_t = train.epochs. Trials that reach max_t end on their own, not stopped
    by the scheduler at their last report (stop_last_trials=False): their final checkpoint and MLflow run close."""
    if cfg.sweep.scheduler == "none":
        return None
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="epoch", max_t=cfg.train.epochs, grace_period=cfg.sweep.grace_period,
                         reduction_factor=cfg.sweep.reduction_factor, stop_last_trials=False)


def make_search(cfg: JobConfig) -> Any | None:
    if cfg.sweep.search != "optuna":
        return None  # Tune's BasicVariantGenerator: random sampling, grids expanded
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(seed=cfg.seed)


@dataclass
class TrialContext:
    """What every trial needs from the sweep's driver (handed over by ``tune.with_parameters``)."""

    base: dict[str, Any]  # the resolved base config (absolute tracking URI and storage)
    sweep_dir: str
    home: str
    parent_run_id: str | None
    report: Any  # the driver's PreflightReport, dataset included
    fault: str | None = None


def run_tuner(plan: SweepPlan, report: Any, parent: Any, limit: int | None, fault: str | None = None) -> tuple[Any, list[str]]:
    """Build (or restore) the Tuner and run it. Returns the ResultGrid and the orphaned placement groups removed."""
    from ray import tune

    from elastic_train.sweep.placement_groups import OrphanedPlacementGroupReaper, settle

    context = TrialContext(resolved_base(plan).model_dump(mode="json"), plan.sweep_dir, str(plan.launch.home),
                           parent.run_id if parent else None, report, fault)
    trainable = tune.with_resources(tune.with_parameters(run_trial, context=context), {"CPU": plan.cfg.sweep.trial_cpus})
    RunStorage(plan.launch.storage_path, plan.name).save_config(plan.cfg.model_dump(mode="json"))
    if plan.restoring:  # the restored Tuner brings back its own config, scheduler state and callbacks
        tuner = tune.Tuner.restore(plan.sweep_dir, trainable=trainable, resume_unfinished=True, resume_errored=True)
    else:
        s = plan.cfg.sweep
        tuner = tune.Tuner(
            trainable,
            param_space=tune_space(plan.cfg),
            tune_config=tune.TuneConfig(
                metric=s.metric, mode=s.mode, num_samples=s.num_samples, max_concurrent_trials=limit,
                scheduler=make_scheduler(plan.cfg), search_alg=make_search(plan.cfg),
                trial_name_creator=_trial_name, trial_dirname_creator=_trial_dirname,
            ),
            run_config=tune.RunConfig(
                name=plan.name, storage_path=plan.launch.storage_path,
                # A trial's failures are handled inside it, by Ray Train, within failure.max_failures; a trial
                # that still fails is reported (and retried by --resume), not retried again here.
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                callbacks=[OrphanedPlacementGroupReaper()], verbose=1,
            ),
        )
    before = len(OrphanedPlacementGroupReaper.removed)
    try:
        grid = tuner.fit()
    finally:
        settle()
    return grid, OrphanedPlacementGroupReaper.removed[before:]


def _trial_name(trial: Any) -> str:
    return trial_run_name(trial.trial_id)


def _trial_dirname(trial: Any) -> str:
    return f"{TUNE_PREFIX}{trial.trial_id}"


def resolved_base(plan: SweepPlan) -> JobConfig:
    """The base config with everything a trial must not resolve from its own working directory made absolute."""
    from tracking.runs import resolve_uri

    fixed: dict[str, Any] = {"checkpoint.storage_path": plan.launch.storage_path}
    if plan.cfg.tracking.enabled:
        fixed["tracking.uri"] = resolve_uri(plan.cfg.tracking.uri, plan.launch.home)
    if plan.cfg.data.path and "://" not in plan.cfg.data.path:
        fixed["data.path"] = str(Path(plan.cfg.data.path).expanduser().resolve())
    return config_mod.with_overrides(plan.cfg, fixed)


# ---------------------------------------------------------------------------------------- a trial


def trial_run_name(trial_id: str) -> str:
    return f"{TRIAL_PREFIX}{trial_id}"


def run_trial(overrides: dict[str, Any], context: TrialContext) -> None:
    """One trial: the job config with this trial's values, run by ``driver.fit`` as ``jobs.train`` runs it."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id()
    run_name = trial_run_name(trial_id)
    cfg = config_mod.with_overrides(config_mod.validate(context.base), {**overrides, "name": run_name})
    storage = RunStorage(context.sweep_dir, run_name)
    launch = driver.Launch(cfg, run_name, Path(context.home), context.sweep_dir, storage.has_checkpoints(), None)
    report = trial_report(context, cfg)
    spec = driver.start_tracking(launch, report, kind="trial", parent_run_id=context.parent_run_id)
    if spec is not None:
        from tracking.mlflow_tracker import MlflowTracker

        tracker = MlflowTracker(spec, start_system_metrics=False)
        tracker.set_tags({"trial_id": trial_id, **{f"sweep.{k}": v for k, v in overrides.items()}})
        tracker.close(timeout_s=30)
    outcome = driver.fit(launch, report, spec, fault=context.fault, callbacks=[TuneReportCallback()])
    if outcome.already_complete:  # a restored sweep re-ran a trial whose training had already ended
        meta = outcome.already_complete["meta"]
        tune.report({**meta.get("metrics", {}), "checkpoint_path": outcome.already_complete["checkpoint"]})
    summary = driver.summarize(launch, outcome, spec)
    driver.finish_tracking(launch, outcome, spec, summary, report, log_model=False)  # the parent holds the model
    if outcome.status != "FINISHED":
        raise TrialFailed(f"{run_name} {outcome.status}: {summary.get('error', '')}")


def trial_report(context: TrialContext, cfg: JobConfig) -> Any:
    """The driver's preflight report, with the data rebuilt when the trial changed a data key or the seed."""
    report = context.report
    base = config_mod.validate(context.base)
    if cfg.data == base.data and cfg.seed == base.seed:
        return report
    from elastic_train.data import describe
    from elastic_train.launch.preflight import check_static

    bundle, _ = check_static(cfg)
    report = copy.copy(report)
    report.bundle, report.data = bundle, describe(bundle)
    return report


# ---------------------------------------------------------------------------------------- results


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
    import json

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


def start_parent(plan: SweepPlan, report: Any) -> Any:
    """The sweep's parent run: created before any trial, found again by name on ``--resume``."""
    return driver.start_tracking(plan.launch, report, kind="sweep")


def close_children(parent: Any, rows: list[TrialRow], metric: str) -> None:
    """Give each trial's child run its sweep outcome and a terminal status.

    Trials stopped by the scheduler were ended mid-run (their process is gone): they are marked FINISHED with
    ``stopped_early=true``, as Ray's own MLflow callback marks early-stopped trials.
    """
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    from tracking.runs import RUN_NAME_TAG

    client = MlflowClient(tracking_uri=parent.uri)
    children = client.search_runs([parent.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.run_id}'",
                                  max_results=5000)
    by_name = {r.data.tags.get(RUN_NAME_TAG): r for r in children}
    for row in rows:
        run = by_name.get(row.run_name)
        if run is None:
            continue
        row.mlflow_run_id = run.info.run_id
        metrics = {"epochs_run": row.epochs, **({f"best_{metric}": row.best_metric} if row.best_metric is not None else {})}
        now = int(time.time() * 1000)
        client.log_batch(run.info.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                         tags=[RunTag("sweep_status", row.status), RunTag("stopped_early", str(row.status == "STOPPED").lower())])
        status = {"FAILED": "FAILED", "UNFINISHED": "KILLED"}.get(row.status, "FINISHED")
        if run.info.status != status:
            client.set_terminated(run.info.run_id, status=status)


def finish_parent(plan: SweepPlan, summary: dict[str, Any], rows: list[TrialRow], parent: Any, report: Any) -> None:
    """Results table, plot, best trial's config, checkpoint and model (registered if asked) into the parent run."""
    import json
    import tempfile

    import yaml
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    from tracking.runs import end_run

    client = MlflowClient(tracking_uri=parent.uri)
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
        client.log_artifacts(parent.run_id, tmp)
    if best and best.get("checkpoint"):
        from ray.train import Checkpoint

        with Checkpoint(best["checkpoint"]).as_directory() as d:
            client.log_artifacts(parent.run_id, d, artifact_path="best_checkpoint")
        try:
            best.update(driver._log_model(plan.launch, parent, best["checkpoint"], report))
        except Exception as e:  # noqa: BLE001 - the sweep ran; a model upload failure is reported, not fatal
            best["model_error"] = f"{type(e).__name__}: {e}"
    now = int(time.time() * 1000)
    metrics = {"total_epochs": summary["total_epochs"], "trials": len(rows), "wall_s": summary["wall_s"],
               "trials_stopped_early": sum(r.status == "STOPPED" for r in rows),
               "trials_failed": sum(r.status == "FAILED" for r in rows)}
    if best:
        metrics[f"best_{plan.cfg.sweep.metric}"] = best["metric"]
    tags = {"best_trial": best.get("trial_id", "-") if best else "-",
            "best_run_id": (best or {}).get("mlflow_run_id") or "-"}
    client.log_batch(parent.run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                     tags=[RunTag(k, str(v)) for k, v in tags.items()])
    end_run(parent.uri, parent.run_id, summary["status"])


# ---------------------------------------------------------------------------------------- summary


def summarize(plan: SweepPlan, rows: list[TrialRow], parent: Any, reclaimed: list[str], limit: int | None) -> dict[str, Any]:
    s = plan.cfg.sweep
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
        "wall_s": time.time() - plan.launch.started,
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
    tail = [f"sweep {summary['sweep']}: {len(trials)} trials, {summary['total_epochs']} epochs in {summary['wall_s']:.0f} s;"
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
        w.writerow(["rank", "trial_id", "status", "epochs", f"best_{cfg.sweep.metric}", *keys, "mlflow_run_id", "checkpoint"])
        for i, r in enumerate(rows):
            w.writerow([i + 1, r.trial_id, r.status, r.epochs, r.best_metric, *(r.config.get(k) for k in keys),
                        r.mlflow_run_id, r.checkpoint])


def plot_sweep(rows: list[TrialRow], cfg: JobConfig, path: Path) -> None:
    """Left: each trial's best metric against the learning rate, coloured by global batch size.
    Right: every trial's learning curve (metric per epoch), same colours; stopped trials dashed."""
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
        pts = [(r.config.get(x_key), r.best_metric) for r in rows
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
    fig.savefig(path, dpi=110)
    plt.close(fig)
