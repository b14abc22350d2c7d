"""The Tuner: the search space, scheduler and search algorithm, and one trial = one ``fit(ctx)`` (invariant 6).

A trial (:func:`run_trial`) applies its overrides to the job config and runs :func:`~elastic_train.launch.fit.fit`
inside a Tune function trainable, with Ray's ``TuneReportCallback`` passing every checkpoint report on to Tune.
Workers report at checkpoint cadence and every report carries ``epoch`` (completed epochs), so ASHA's time
attribute is ``epoch``: extra mid-epoch reports repeat the epoch of the rung already recorded and change nothing.

Layout under ``checkpoint.storage_path``::

    <sweep name>/                       Tune's experiment (tuner.pkl, experiment_state-*.json)
        elastic_train_config.json       the sweep's resolved config (``--resume NAME`` starts from it)
        tune-<trial id>/                Tune's trial folder (result.json, progress.csv)
        trial-<trial id>/               the trial's Ray Train run: checkpoints, snapshot (a restart resumes it)
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.config import JobConfig
from elastic_train.launch import context, timeline
from elastic_train.launch.context import RunContext
from elastic_train.launch.fit import fit, share_data
from elastic_train.launch.storage import RunStorage
from elastic_train.launch.summary import finish, summarize
from elastic_train.sweep.plan import TRIAL_PREFIX, TUNE_PREFIX, SweepPlan, trial_run_name
from tracking import backend_for

__all__ = ["TRIAL_PREFIX", "TUNE_PREFIX", "run_trial", "run_tuner", "trial_run_name"]


class TrialFailed(RuntimeError):
    """A trial's run ended FAILED after its own failure budget (``failure.max_failures``)."""


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
    if cfg.sweep.scheduler == "pbt":
        return make_pbt(cfg)
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(time_attr="epoch", max_t=cfg.train.epochs, grace_period=cfg.sweep.grace_period,
                         reduction_factor=cfg.sweep.reduction_factor, stop_last_trials=False)


def pbt_mutations(cfg: JobConfig) -> dict[str, Any]:
    """PBT's explore step per swept key: a continuous range is resampled from its distribution (or the value
    scaled by 0.8 / 1.2), a choice moves to a neighbouring value."""
    space = tune_space(cfg.model_copy(update={"sweep": cfg.sweep.model_copy(update={"search": "random"})}))
    return {k: list(d.values or []) if d.type in ("choice", "grid") else space[k] for k, d in cfg.sweep.space.items()}


def make_pbt(cfg: JobConfig) -> Any:
    """Population-based training on completed epochs: every ``perturbation_interval`` epochs a trial in the
    bottom ``quantile_fraction`` continues from a top trial's latest checkpoint with perturbed values
    (:func:`run_trial` turns Tune's restart from the donor's checkpoint into a continuation of its state)."""
    from elastic_train.sweep.relay import LastReportKeepsPBT

    s = cfg.sweep
    return LastReportKeepsPBT(time_attr="epoch", perturbation_interval=s.perturbation_interval,
                              hyperparam_mutations=pbt_mutations(cfg), quantile_fraction=s.quantile_fraction,
                              resample_probability=s.resample_probability, synch=s.synch, max_t=cfg.train.epochs)


def make_search(cfg: JobConfig) -> Any | None:
    if cfg.sweep.search != "optuna":
        return None  # Tune's BasicVariantGenerator: random sampling, grids expanded
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(seed=cfg.seed)


@dataclass(frozen=True)
class TrialContext:
    """What every trial needs from the sweep's driver (handed over by ``tune.with_parameters``)."""

    sweep: RunContext  # the sweep's context: resolved base config, cluster, parent tracking run (no dataset
    sweep_dir: str     # when data_ref holds it)
    data_ref: Any | None = None  # the sweep's dataset, put in the object store once for every trial


def run_tuner(plan: SweepPlan, limit: int | None) -> tuple[Any, list[str]]:
    """Build (or restore) the Tuner and run it. Returns the ResultGrid and the orphaned placement groups removed."""
    from ray import tune

    from elastic_train.sweep.elastic import TrialFloors
    from elastic_train.sweep.placement_groups import OrphanedPlacementGroupReaper, settle
    from elastic_train.sweep.progress import TrialProgress

    # The dataset goes into the object store once per sweep; trials and their workers get the reference (a
    # trial that changes a data key builds its own, trial_context). Without it each trial re-put its copy.
    data_ref = share_data(plan.ctx.bundle)
    base = replace(plan.ctx, cfg=resolved_base(plan), bundle=None if data_ref is not None else plan.ctx.bundle)
    trial = TrialContext(base, plan.sweep_dir, data_ref)
    callbacks = [OrphanedPlacementGroupReaper(expected=plan.cfg.sweep.scheduler == "pbt"),
                 TrialProgress(plan.sweep_dir, plan.cfg)]
    if plan.cfg.scaling.elastic:  # each live trial's floor; a trial that ends frees its workers at once
        callbacks.append(TrialFloors(partial(trial_floor, plan.cfg, plan.ctx.use_gpu)))
    trainable = tune.with_resources(tune.with_parameters(run_trial, trial=trial), {"CPU": plan.cfg.sweep.trial_cpus})
    RunStorage(plan.ctx.storage_path, plan.name).save_config(plan.cfg.model_dump(mode="json"))
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
                # A stopped or exploited trial's process ends, and with it the Ray Train run it owned.
                reuse_actors=False,
            ),
            run_config=tune.RunConfig(
                name=plan.name, storage_path=plan.ctx.storage_path,
                # A trial's failures are handled inside it, by Ray Train, within failure.max_failures; a trial
                # that still fails is reported (and retried by --resume), not retried again here.
                failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
                # Tune's table shows each trial's last report; ours ranks by its best checkpoint (results.py).
                callbacks=callbacks, verbose=0,
            ),
        )
    before = len(OrphanedPlacementGroupReaper.removed)
    try:
        with warnings.catch_warnings():  # PBT's advice to reuse actors: a trial's process must end (reuse_actors)
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            grid = tuner.fit()
    finally:
        settle()
    return grid, OrphanedPlacementGroupReaper.removed[before:]


def trial_floor(cfg: JobConfig, use_gpu: bool, overrides: dict[str, Any]) -> list[dict[str, float]]:
    """What a trial holds at its minimum: its driver's CPUs and ``min_workers`` workers (elastic.TrialFloors)."""
    from elastic_train.launch.preflight import worker_resources
    from elastic_train.sweep.elastic import floor_bundles

    c = config_mod.with_overrides(cfg, {k: v for k, v in overrides.items() if k in cfg.sweep.space})
    return floor_bundles(c.sweep.trial_cpus, worker_resources(c, use_gpu), c.scaling.min_workers)


def _trial_name(trial: Any) -> str:
    return trial_run_name(trial.trial_id)


def _trial_dirname(trial: Any) -> str:
    return f"{TUNE_PREFIX}{trial.trial_id}"


def resolved_base(plan: SweepPlan) -> JobConfig:
    """The base config with everything a trial must not resolve from its own working directory made absolute."""
    s = plan.cfg.sweep
    # A trial keeps its best checkpoint by the sweep's metric: the checkpoint the sweep calls its best.
    fixed: dict[str, Any] = {"checkpoint.storage_path": plan.ctx.storage_path, "checkpoint.score": s.metric,
                             "checkpoint.score_mode": s.mode}
    if plan.cfg.tracking.enabled:
        fixed["tracking.uri"] = context.tracking_backend(plan.ctx).uri
    if plan.cfg.data.path and "://" not in plan.cfg.data.path:
        fixed["data.path"] = str(Path(plan.cfg.data.path).expanduser().resolve())
    return config_mod.with_overrides(plan.cfg, fixed)


# ---------------------------------------------------------------------------------------- a trial


def run_trial(overrides: dict[str, Any], trial: TrialContext) -> None:
    """One trial: the job config with this trial's values, run by ``fit`` as ``jobs.train`` runs it."""
    from ray import tune
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_id = tune.get_context().get_trial_id()
    parent = trial.sweep.tracking
    donor = donor_checkpoint(tune.get_checkpoint(), trial_run_name(trial_id))
    if donor is not None:  # PBT cloned a stronger trial into this one: its own past is replaced
        RunStorage(trial.sweep_dir, trial_run_name(trial_id)).clear()
    phases = _trial_timeline()
    ctx = trial_context(trial.sweep, trial.sweep_dir, overrides, trial_run_name(trial_id))
    timeline.mark("trial context")
    ctx = context.track(ctx, kind="trial", parent_run_id=parent.run_id if parent else None)
    data_ref = trial.data_ref if ctx.bundle is None else None  # None: the trial built its own data
    if ctx.tracking is not None:
        writer = backend_for(ctx.tracking, ctx.home).writer(ctx.tracking)
        writer.set_tags({"trial_id": trial_id, **{f"sweep.{k}": v for k, v in overrides.items()},
                         "data_object": data_ref.hex() if data_ref is not None else "own"})
        # The hyperparameter schedule as metrics: each life of the trial logs its values at its first step.
        writer.log_metrics({f"hp.{k}": float(v) for k, v in overrides.items() if isinstance(v, int | float)},
                           step=donor[1]["progress"]["global_step"] if donor else 0)
        writer.close(timeout_s=30)
        timeline.mark("trial tags")
    start_from = donor[0] if donor else None
    policy = None
    if ctx.cfg.scaling.elastic:  # starts at its floor, grows into what stopped trials free (elastic.py)
        from elastic_train.sweep.elastic import TrialScalingPolicy

        policy = partial(TrialScalingPolicy, trial_id=trial_id)
    if ctx.cfg.sweep.scheduler == "pbt":  # Tune must hold the trial's checkpoints to clone it (relay.py)
        from elastic_train.sweep.relay import fit_reporting_checkpoints

        outcome = fit_reporting_checkpoints(
            lambda callbacks: fit(ctx, callbacks=callbacks, data_ref=data_ref, start_from=start_from,
                                  scaling_policy=policy))
    else:
        outcome = fit(ctx, callbacks=[TuneReportCallback()], data_ref=data_ref, start_from=start_from,
                      scaling_policy=policy)
    if outcome.already_complete:  # a restored sweep re-ran a trial whose training had already ended
        meta = outcome.already_complete["meta"]
        tune.report({**meta.get("metrics", {}), "checkpoint_path": outcome.already_complete["checkpoint"]})
    summary = summarize(ctx, outcome)
    finish(ctx, outcome, summary, log_model=False)  # the parent holds the sweep's model
    if phases is not None:
        _save_trial_timeline(phases, trial_id)
    if outcome.status != "FINISHED":
        raise TrialFailed(f"{ctx.run_name} {outcome.status}: {summary.get('error', '')}")


TRIAL_TIMELINE_ENV = "ELASTIC_TRAIN_TRIAL_TIMELINE"  # a folder: each trial writes where its driver's time went


def _trial_timeline() -> Any | None:
    """With ``$ELASTIC_TRAIN_TRIAL_TIMELINE`` (bench/sweep_cost.py): a timeline of this trial's driver phases."""
    import os

    if not os.environ.get(TRIAL_TIMELINE_ENV):
        return None
    tl = timeline.begin(from_process_start=False)
    tl.process_start = timeline.process_start_unix()
    return tl


def _save_trial_timeline(tl: Any, trial_id: str) -> None:
    import os

    out = Path(os.environ[TRIAL_TIMELINE_ENV]) / f"{trial_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"process_start": tl.process_start, "launched": tl.launched,
                               "phases": tl.phases(), "ended": time.time()}))


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
    if cfg.data.model_copy(update={"trace_path": None}) != sweep.cfg.data.model_copy(update={"trace_path": None}) \
            or cfg.seed != sweep.cfg.seed:
        from elastic_train.data import describe
        from elastic_train.launch.preflight import check_static

        bundle, _ = check_static(cfg)
        cluster = replace(cluster, data=describe(bundle)) if cluster is not None else None
    resuming = RunStorage(sweep_dir, run_name).has_checkpoints()
    return replace(sweep, cfg=cfg, run_name=run_name, storage_path=sweep_dir, resuming=resuming, config_path=None,
                   started=time.time(), tracking=None, bundle=bundle, cluster=cluster)
