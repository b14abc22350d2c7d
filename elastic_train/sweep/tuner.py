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
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.compat import features
from elastic_train.config import JobConfig
from elastic_train.launch import context, timeline
from elastic_train.launch.context import RunContext
from elastic_train.launch.fit import fit, share_data
from elastic_train.launch.storage import RunStorage
from elastic_train.launch.summary import finish, summarize
from elastic_train.sweep.plan import (
    TRIAL_PREFIX,
    TUNE_PREFIX,
    SweepPlan,
    donor_checkpoint,
    trial_context,
    trial_run_name,
)
from elastic_train.sweep.runs import read_handoff, write_summary
from elastic_train.train.resources import RunResources
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
    sweep_dir: str     # when shared.data_ref holds it)
    # What every trial's fit shares: the sweep's dataset (put in the object store once) and its MLflow relay
    # (every trial's rank 0 logs through it)
    shared: RunResources = RunResources()
    env: dict[str, str] = field(default_factory=features.process_env)  # the driver's switch of internals


def reaps_placement_groups() -> bool:
    """Whether this sweep's reaper ends its trials' placement groups (sweep/placement_groups.py), so that its
    trials start none of Ray Train's PlacementGroupCleaners (else they do: the public path)."""
    return features.enabled("sweep_reaper")


def run_tuner(plan: SweepPlan, limit: int | None) -> tuple[Any, list[str]]:
    """Build (or restore) the Tuner and run it. Returns the ResultGrid and the orphaned placement groups removed."""
    from ray import tune

    from elastic_train.sweep.elastic import TrialFloors
    from elastic_train.sweep.placement_groups import OrphanedPlacementGroupReaper, settle
    from elastic_train.sweep.progress import TrialProgress, TrialStatuses

    # The dataset goes into the object store once per sweep; trials and their workers get the reference (a
    # trial that changes a data key builds its own, trial_context). Without it each trial re-put its copy.
    data_ref = share_data(plan.ctx.bundle)
    base = replace(plan.ctx, cfg=resolved_base(plan), bundle=None if data_ref is not None else plan.ctx.bundle)
    relay = None
    parent = plan.ctx.tracking
    if parent is not None and parent.backend == "mlflow":  # MLflow imported once for all trials' workers
        from tracking.relay import start_relay

        relay = start_relay(parent.env)
    reaped = reaps_placement_groups()  # else Ray Train's own cleaners (placement_groups.py)
    trial = TrialContext(base, plan.sweep_dir, RunResources(data_ref=data_ref, tracking_relay=relay,
                                                            placement_groups_reaped=reaped))
    callbacks: list[Any] = [TrialProgress(plan.sweep_dir, plan.cfg), TrialStatuses()]
    if reaped:
        callbacks.insert(0, OrphanedPlacementGroupReaper(expected=plan.cfg.sweep.scheduler == "pbt",
                                                         release_requests=plan.cfg.scaling.elastic))
    if plan.ctx.tracking is not None:  # each trial's run opened and closed here, not in the trial (runs.py)
        from elastic_train.data.spec import source_of
        from elastic_train.sweep.runs import TrialRuns

        bundle = plan.ctx.bundle
        dataset = vars(source_of(bundle, plan.cfg.data.name)) if bundle is not None else None
        callbacks.append(TrialRuns(base, plan.sweep_dir, dataset, data_ref.hex() if data_ref is not None else "own"))
    if elastic_trials(plan.cfg):  # each live trial's floor; a trial that ends frees its workers at once
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
                reuse_actors=reuses_trial_processes(plan.cfg),
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
    from elastic_train.compat.ray_tune import quiet_tune_output

    quiet_tune_output()  # no start banner: the sweep prints its own header (plan.py)
    try:
        with warnings.catch_warnings():  # PBT's advice to reuse actors: an exploited trial's process must end
            warnings.filterwarnings("ignore", message="Consider boosting PBT performance")
            grid = tuner.fit()
    finally:
        from elastic_train.sweep.runs import drain_all

        drain_all()  # the trial runs still being closed (bounded)
        if relay is not None:  # what stopped trials' workers logged is sent before it goes
            from tracking.relay import stop_relay

            stop_relay(relay)
        settle()
    return grid, OrphanedPlacementGroupReaper.removed[before:]


def reuses_trial_processes(cfg: JobConfig) -> bool:
    """Whether the next trial's Tune actor runs in the process of a trial that has ended (Tune's
    ``reuse_actors``): it has imported torch, Ray Tune and Ray Train, so a trial starts in ~0.5 s instead of
    paying a new process (~4 s on 2 cores: docs/sweeps.md, *Per-trial cost*). A trial ASHA stops ends its Ray
    Train run first (stops.py). Not with PBT: its exploits restart trials from a donor's checkpoint in a process
    of their own (relay.py). What a trial leaves in the process is the driver's side only (its Train workers are
    new processes, warm spares); per-run state is set per run, and a test checks that a trial's result does not
    depend on the process that ran one before it."""
    return cfg.sweep.scheduler in ("none", "asha") and features.enabled("trial_reuse")


def elastic_trials(cfg: JobConfig) -> bool:
    """Whether elastic trials start at their floor and grow into what stopped trials free (sweep/elastic.py,
    feature ``elastic_trials``); otherwise each is Ray Train's elastic run as Ray sizes it."""
    return cfg.scaling.elastic and features.enabled("elastic_trials")


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
                             "checkpoint.score_mode": s.mode,
                             # the driver's switch of internals (its config or its environment) in every trial
                             "compat.internals": features.switch_value()}
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

    features.adopt(trial.env)  # the driver's switch of internals (and trace), on a cluster started before it
    trial_id = tune.get_context().get_trial_id()
    parent = trial.sweep.tracking
    donor = donor_checkpoint(tune.get_checkpoint(), trial_run_name(trial_id))
    if donor is not None:  # PBT cloned a stronger trial into this one: its own past is replaced
        RunStorage(trial.sweep_dir, trial_run_name(trial_id)).clear()
    phases = _trial_timeline()
    run_name = trial_run_name(trial_id)
    ctx = trial_context(trial.sweep, trial.sweep_dir, overrides, run_name)
    timeline.mark("trial context")
    handoff = read_handoff(trial.sweep_dir, run_name) if parent is not None and ctx.cfg.tracking.enabled else None
    if handoff is not None:  # the sweep's driver opened this trial's run (runs.py) and closes it
        ctx = replace(ctx, tracking=handoff.spec(parent))
    else:
        ctx = _track_here(ctx, trial_id, overrides, parent, donor, trial.shared.data_ref)
    data_ref = trial.shared.data_ref if ctx.bundle is None else None  # None: the trial built its own data
    start_from = donor[0] if donor else None
    policy = None
    if elastic_trials(ctx.cfg):  # starts at its floor, grows into what stopped trials free (elastic.py)
        from elastic_train.sweep.elastic import TrialScalingPolicy

        policy = partial(TrialScalingPolicy, trial_id=trial_id)
    resources = replace(trial.shared, data_ref=data_ref, start_from=start_from, scaling_policy=policy)
    if ctx.cfg.sweep.scheduler == "pbt":  # Tune must hold the trial's checkpoints to clone it (relay.py)
        from elastic_train.sweep.relay import fit_reporting_checkpoints

        outcome = fit_reporting_checkpoints(lambda callbacks: fit(ctx, replace(resources, callbacks=tuple(callbacks))))
    else:
        from elastic_train.sweep.stops import StopWatch

        with StopWatch(elastic=ctx.cfg.scaling.elastic) as stop:
            outcome = fit(ctx, replace(resources, callbacks=(TuneReportCallback(),)))
        if stop.fired.is_set() and outcome.status != "FINISHED":  # stopped by the scheduler, its Train run ended
            return  # (stops.py): Tune hands this process to the next trial; the driver closes the run
    if outcome.already_complete:  # a restored sweep re-ran a trial whose training had already ended
        meta = outcome.already_complete["meta"]
        tune.report({**meta.get("metrics", {}), "checkpoint_path": outcome.already_complete["checkpoint"]})
    summary = summarize(ctx, outcome)
    if handoff is not None:
        write_summary(trial.sweep_dir, run_name, summary)  # the driver closes the run from it
        timeline.mark("summary")
    else:
        finish(ctx, outcome, summary, log_model=False)  # the parent holds the sweep's model
    if phases is not None:
        _save_trial_timeline(phases, trial_id, summary)
    if outcome.status != "FINISHED":
        raise TrialFailed(f"{ctx.run_name} {outcome.status}: {summary.get('error', '')}")


def _track_here(ctx: RunContext, trial_id: str, overrides: dict[str, Any], parent: Any, donor: Any,
                data_ref: Any | None) -> RunContext:
    """The trial opens its own run (the driver did not: runs.TrialRuns), tags and hyperparameters included."""
    ctx = context.track(ctx, kind="trial", parent_run_id=parent.run_id if parent else None)
    if ctx.tracking is not None:
        data_ref = data_ref if ctx.bundle is None else None
        writer = backend_for(ctx.tracking, ctx.home).writer(ctx.tracking)
        writer.set_tags({"trial_id": trial_id, **{f"sweep.{k}": v for k, v in overrides.items()},
                         "data_object": data_ref.hex() if data_ref is not None else "own"})
        # The hyperparameter schedule as metrics: each life of the trial logs its values at its first step.
        writer.log_metrics({f"hp.{k}": float(v) for k, v in overrides.items() if isinstance(v, int | float)},
                           step=donor[1]["progress"]["global_step"] if donor else 0)
        writer.close(timeout_s=30)
        timeline.mark("trial tags")
    return ctx


TRIAL_TIMELINE_ENV = "ELASTIC_TRAIN_TRIAL_TIMELINE"  # a folder: each trial writes where its driver's time went


def _trial_timeline() -> Any | None:
    """With ``$ELASTIC_TRAIN_TRIAL_TIMELINE`` (bench/sweep_cost.py): a timeline of this trial's driver phases."""
    import os

    if not os.environ.get(TRIAL_TIMELINE_ENV):
        return None
    tl = timeline.begin(from_process_start=False)
    tl.process_start = timeline.process_start_unix()
    return tl


def _save_trial_timeline(tl: Any, trial_id: str, summary: dict[str, Any]) -> None:
    import os

    out = Path(os.environ[TRIAL_TIMELINE_ENV]) / f"{trial_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"process_start": tl.process_start, "launched": tl.launched,
                               "phases": tl.phases(), "ended": time.time(),
                               "startup": summary.get("startup"), "teardown": summary.get("teardown")}))
