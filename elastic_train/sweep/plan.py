"""The sweep's plan: its config and name, every mistake in the ``sweep`` section, and how many trials fit at once.

Nothing here starts a trial; :func:`plan_sweep` needs no Ray, :func:`check_concurrency` only reads the cluster's
resources. Every mistake is a ConfigError naming the field (exit 2) before anything is acquired.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.config import SCORE_METRICS, ConfigError, Distribution, JobConfig
from elastic_train.launch import context
from elastic_train.launch.context import RunContext
from elastic_train.launch.preflight import PreflightReport, worker_resources
from elastic_train.launch.storage import RunStorage

log = logging.getLogger(__name__)

# Keys a trial may not change: they name the sweep, its storage or its tracking, or are the sweep itself.
UNSWEEPABLE = ("sweep.", "tracking.", "name", "checkpoint.storage_path")

# A trial's folders under the sweep's: Tune's record (``tune-<id>``) and its Ray Train run (``trial-<id>``).
TRIAL_PREFIX, TUNE_PREFIX = "trial-", "tune-"


def trial_run_name(trial_id: str) -> str:
    """The trial's run name: its Ray Train run folder and its MLflow child run."""
    return f"{TRIAL_PREFIX}{trial_id}"


@dataclass(frozen=True)
class SweepPlan:
    ctx: RunContext  # the sweep's: base config (+ sweep section), run name = sweep name, storage
    restoring: bool  # a Tune experiment of this name exists: continue it (Tuner.restore)
    notes: tuple[str, ...] = ()  # what the plan changed in the defaults itself (one line each, in the header)

    @property
    def cfg(self) -> JobConfig:
        return self.ctx.cfg

    @property
    def name(self) -> str:
        return self.ctx.run_name

    @property
    def sweep_dir(self) -> str:
        return RunStorage(self.ctx.storage_path, self.name).uri()

    def header(self) -> str:
        lines = [f"sweep {self.name}{' (resuming)' if self.restoring else ''}: storage {self.sweep_dir}"]
        if self.ctx.ray_target:
            lines.append(f"ray: {self.ctx.ray_target}")
        if self.ctx.cluster is not None:
            lines.append(self.ctx.cluster.render())
        lines.extend(self.notes)
        return "\n".join(lines)


def plan_sweep(config_path: str | None, overrides: list[str], resume: str | None = None,
               launched: float | None = None) -> SweepPlan:
    """Resolve and check the sweep without Ray. ``--resume NAME`` (or a reused ``name``) continues that sweep.
    ``launched``: when the sweep started (its wall counts from there); default now."""
    ctx = context.plan(config_path, overrides, resume, launched=launched)
    cfg, notes = pbt_defaults(ctx.cfg)
    cfg, warm = spares_from_the_first_step(cfg)
    ctx = replace(ctx, cfg=cfg)
    notes = (*notes, *warm)
    validate_sweep(ctx.cfg)
    ctx = replace(ctx, resuming=False)  # the sweep folder holds no checkpoints of its own; its trials do
    sweep_dir = RunStorage(ctx.storage_path, ctx.run_name).uri()
    restoring = _tune_state_exists(sweep_dir)
    if resume and not restoring:
        log.warning("sweep %s has no Tune state yet (stopped before its first save): starting it again", resume)
    return SweepPlan(ctx, restoring, notes)


def pbt_defaults(cfg: JobConfig) -> tuple[JobConfig, tuple[str, ...]]:
    """A PBT sweep from the defaults: ``checkpoint.every_seconds`` left at its default becomes null (epoch-end
    checkpoints only, which a perturbed ``train.global_batch_size`` needs), with the one line saying so. A value
    the user set stays and :func:`validate_pbt` refuses it, naming the field."""
    s, c = cfg.sweep, cfg.checkpoint
    if (s.scheduler != "pbt" or "train.global_batch_size" not in s.space or c.every_steps or not c.every_seconds
            or "every_seconds" in c.model_fields_set):
        return cfg, ()
    note = (f"  pbt perturbs train.global_batch_size: checkpoint.every_seconds={c.every_seconds:g} (the default) "
            "-> null, checkpoints at epoch ends only")
    return config_mod.with_overrides(cfg, {"checkpoint.every_seconds": None}), (note,)


def spares_from_the_first_step(cfg: JobConfig) -> tuple[JobConfig, tuple[str, ...]]:
    """In a sweep, spare worker processes (train/spares.py) start at a trial's first step, not
    ``failure.spares_after_s`` into it: a trial ends and the next one's Train workers start on the processes it
    warmed (fresh processes that never ran a trial), instead of new ones importing Ray Train and torch. A value
    the user set stays, and ``failure.spare_workers=0`` turns spares off."""
    f = cfg.failure
    if f.spare_workers == 0 or not f.spares_after_s or "spares_after_s" in f.model_fields_set:
        return cfg, ()
    note = (f"  spares: each trial warms the worker processes of the next from its first step "
            f"(failure.spares_after_s={f.spares_after_s:g} -> 0; failure.spare_workers=0: none)")
    return config_mod.with_overrides(cfg, {"failure.spares_after_s": 0.0}), (note,)


def _tune_state_exists(sweep_dir: str) -> bool:
    from ray.tune import Tuner

    return Tuner.can_restore(sweep_dir)


def validate_sweep(cfg: JobConfig) -> None:
    """Every mistake in the ``sweep`` section as a ConfigError naming the field, before anything starts."""
    s = cfg.sweep
    if s.metric not in SCORE_METRICS:
        raise ConfigError("sweep.metric", s.metric, f"not a reported metric; use one of {', '.join(SCORE_METRICS)}")
    if s.search == "optuna" and importlib.util.find_spec("optuna") is None:
        raise ConfigError("sweep.search", "optuna", "optuna is not installed: pip install 'elastic-train[optuna]'")
    budget = "train.max_steps" if cfg.train.max_steps is not None else (
        "train.max_tokens" if cfg.train.max_tokens is not None else None)
    if budget and s.scheduler != "none":  # the schedulers count completed epochs; a step budget is not one
        raise ConfigError("sweep.scheduler", s.scheduler, f"counts train.epochs, but {budget} sets the budget; "
                                                          "use sweep.scheduler=none (or train.epochs)")
    if s.scheduler == "asha" and s.grace_period > cfg.train.epochs:
        raise ConfigError("sweep.grace_period", s.grace_period, f"longer than train.epochs={cfg.train.epochs}")
    if s.scheduler == "pbt":
        validate_pbt(cfg)
    known = config_mod.leaf_keys()
    for key, dist in s.space.items():
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            raise ConfigError(
                "sweep.space", key, "unknown config key" + (f"; did you mean {hint[0]!r}?" if hint else "")
            )
        if key.startswith(UNSWEEPABLE):
            raise ConfigError("sweep.space", key, "cannot be swept (it names the sweep, its storage or tracking)")
        if key == "train.epochs" and s.scheduler in ("asha", "pbt"):
            raise ConfigError(
                "sweep.space", key, f"{s.scheduler}'s budget is train.epochs; do not sweep it (or use scheduler=none)"
            )
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


PBT_KEYS = ("train.lr", "train.global_batch_size")


def validate_pbt(cfg: JobConfig) -> None:
    """What population-based training needs: a cadence inside the budget, checkpoints at epoch ends (a clone
    continues the donor's latest), Tune's own trial generator, and only keys a clone can take over mid-run."""
    s, c = cfg.sweep, cfg.checkpoint
    if s.perturbation_interval > cfg.train.epochs:
        raise ConfigError("sweep.perturbation_interval", s.perturbation_interval,
                          f"longer than train.epochs={cfg.train.epochs}: no trial would ever be perturbed")
    if s.search == "optuna":
        raise ConfigError("sweep.search", "optuna", "pbt draws and perturbs the values itself; use random or grid")
    if not c.at_epoch_end:
        raise ConfigError("checkpoint.at_epoch_end", False, "pbt clones a trial at its epoch-end checkpoints")
    for key in s.space:
        if key not in PBT_KEYS:
            raise ConfigError("sweep.space", key, f"pbt perturbs {' and '.join(PBT_KEYS)} only (a clone keeps "
                              "the donor's model and optimizer); sweep it with scheduler=asha or none")
    if "train.global_batch_size" in s.space and (c.every_steps or c.every_seconds):
        field, value = ("checkpoint.every_steps", c.every_steps) if c.every_steps else (
            "checkpoint.every_seconds", c.every_seconds)
        raise ConfigError(field, value, "pbt perturbs train.global_batch_size: checkpoint at epoch ends only "
                          "(null, or leave it unset), so a clone never changes its batch mid-epoch")


def probe_values(dist: Distribution) -> list[Any]:
    """Values that stand for the whole distribution when validating it:
    the candidates, or the ends and an inner point."""
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
    need = {"CPU": cfg.sweep.trial_cpus}
    for k, v in worker_resources(cfg, use_gpu).items():
        need[k] = need.get(k, 0.0) + v * cfg.scaling.min_workers
    return need


def trials_that_fit(need: dict[str, float], totals: dict[str, float]) -> int:
    """Trials the cluster holds at once: its total of each resource over one trial's need, the scarcest."""
    return min((math.floor(totals.get(k, 0.0) / v + 1e-9) for k, v in need.items() if v > 0), default=0)


def check_concurrency(cfg: JobConfig, report: PreflightReport, totals: dict[str, float] | None = None) -> int | None:
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


# ---------------------------------------------------------------------------------------- a trial


def donor_checkpoint(checkpoint: Any | None, run_name: str) -> tuple[str, dict[str, Any]] | None:
    """``(path, meta)`` when Tune restarts this trial from another trial's checkpoint (a PBT exploit); None when
    it has none or it is the trial's own (a restored sweep: Ray Train resumes the trial's own run)."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as d:
        meta_file = Path(d) / "meta.json"
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
    if not meta or meta.get("run_name") == run_name:
        return None
    return checkpoint.path, meta


def trial_context(sweep: RunContext, sweep_dir: str, overrides: dict[str, Any], run_name: str) -> RunContext:
    """The sweep's context for one trial: its config, name and storage; the data rebuilt only when the trial
    changed a data key or the seed. A data trace (``data.trace_path``) goes to a file per trial."""
    trace = sweep.cfg.data.trace_path if "data.trace_path" not in overrides else overrides["data.trace_path"]
    if trace:
        overrides = {**overrides, "data.trace_path": f"{trace}.{run_name}"}
    cfg = config_mod.with_overrides(sweep.cfg, {**overrides, "name": run_name})
    bundle, cluster = sweep.bundle, sweep.cluster
    if rebuilds_data(sweep, overrides):
        from elastic_train.data import describe
        from elastic_train.launch.preflight import check_static

        bundle, _ = check_static(cfg)
        cluster = replace(cluster, data=describe(bundle)) if cluster is not None else None
    resuming = RunStorage(sweep_dir, run_name).has_checkpoints()
    return replace(sweep, cfg=cfg, run_name=run_name, storage_path=sweep_dir, resuming=resuming, config_path=None,
                   started=time.time(), tracking=None, bundle=bundle, cluster=cluster)


def rebuilds_data(sweep: RunContext, overrides: dict[str, Any]) -> bool:
    """The trial changes a data key or the seed: it builds its own data (:func:`trial_context`)."""
    cfg = config_mod.with_overrides(sweep.cfg, {k: v for k, v in overrides.items() if k != "data.trace_path"})
    return cfg.data.model_copy(update={"trace_path": None}) != sweep.cfg.data.model_copy(update={"trace_path": None}) \
        or cfg.seed != sweep.cfg.seed
