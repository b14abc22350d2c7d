"""``build_trainer(cfg, ...) -> TorchTrainer``: the one way a run is built (train and sweep share it)."""

from __future__ import annotations

import os
import sys
from typing import Any

from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from elastic_train.compat.ray_core import SETUP_HOOK_ENV
from elastic_train.compat.ray_train import HEALTH_CHECK_ENV, PREEMPTION_WATCHER_ENV, START_TIMEOUT_ENV
from elastic_train.compat.torch_backend import LightTorchConfig
from elastic_train.config import JobConfig
from elastic_train.launch.context import RunContext
from elastic_train.launch.controller import (
    ControllerPriority,
    FreshClusterView,
    RecordTrainRun,
    RestartPhases,
    leaner_default_callbacks,
)
from elastic_train.launch.preflight import worker_resources
from elastic_train.launch.storage import ray_storage
from elastic_train.train.faults import FaultPlan
from elastic_train.train.resources import RunResources
from elastic_train.train.spares import worker_env
from elastic_train.train.warmup import WorkerWarmup
from elastic_train.train.worker import WorkerArgs, train_loop_per_worker


def ray_num_workers(cfg: JobConfig) -> int | tuple[int, int]:
    s = cfg.scaling
    return (s.min_workers, s.max_workers) if s.elastic else s.min_workers


def build_trainer(ctx: RunContext, resources: RunResources | None = None) -> TorchTrainer:
    """The TorchTrainer for ``ctx``: elastic scaling, failure budget, checkpoint retention, async upload.
    ``resources``: the run's non-config values (train/resources.py); the workers get them less the driver's."""
    cfg, tracking, res = ctx.cfg, ctx.tracking, resources or RunResources()
    _ray_train_env(ctx)
    args = WorkerArgs(
        config=cfg.model_dump(mode="json"),
        run_name=ctx.run_name,
        tracking=tracking,
        resources=res.for_workers(),
        fault=ctx.fault,
        progress_bars=sys.stdout.isatty(),
        launched=ctx.started,
        watch_preemption=_preemption_watched(),
    )
    env_vars = dict(tracking.env) if tracking else {}
    if cfg.failure.spare_workers != 0:  # warm spares for a restart (train/spares.py)
        env_vars.update(spare_worker_env(env_vars))
    markers = FaultPlan.parse(ctx.fault).markers  # restart timing for the benchmarks (docs/faults.md)
    ours = [ControllerPriority(), WorkerWarmup(markers), RecordTrainRun(res.run_folder),
            *([FreshClusterView()] if cfg.scaling.elastic else []),
            *([RestartPhases(markers)] if markers else [])]
    trainer = _Trainer(
        train_loop_per_worker,
        train_loop_config=dict(vars(args)),  # shallow: the resources hold actor handles
        torch_config=LightTorchConfig(),  # the controller's process without torch (compat/torch_backend.py)
        scaling_config=_scaling(ctx, ray_num_workers(cfg),
                                elastic_resize_monitor_interval_s=cfg.scaling.resize_check_interval_s),
        run_config=_run_config(
            ctx,
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.checkpoint.keep,
                checkpoint_score_attribute=cfg.checkpoint.score,
                checkpoint_score_order=cfg.checkpoint.score_mode,
            ),
            callbacks=[*ours, *res.callbacks],
            worker_runtime_env={"env_vars": env_vars} if env_vars else None,
        ),
    )
    trainer.scaling_policy = res.scaling_policy
    trainer.placement_groups_reaped = res.placement_groups_reaped or ctx.embedded_ray
    return trainer


class _Trainer(TorchTrainer):
    """TorchTrainer whose Train controller can get another scaling policy than Ray's default for its config
    (``scaling_policy``: ScalingConfig -> policy; Ray's own when None). Ray builds the policy here, in the driver,
    and hands it to the controller actor. Fewer helper processes than Ray starts (launch/controller.py): none to
    hand out datasets when there are none, and no PlacementGroupCleaner when ``placement_groups_reaped``."""

    scaling_policy: Any | None = None
    placement_groups_reaped: bool = False

    def _create_default_callbacks(self) -> list[Any]:
        return leaner_default_callbacks(super()._create_default_callbacks(), self.train_run_context, self.datasets,
                                        keep_pg_cleaner=not self.placement_groups_reaped)

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        if self.scaling_policy is not None:
            controller_init_kwargs["scaling_policy"] = self.scaling_policy(self.scaling_config)
        run_id = self.train_run_context.run_id
        RUNNING_TRAIN_RUNS.add(run_id)
        try:
            return super()._initialize_and_run_controller(**controller_init_kwargs)
        finally:
            RUNNING_TRAIN_RUNS.discard(run_id)


# The Train run ids whose controller this process waits on (a sweep trial ending its run: sweep/stops.py)
RUNNING_TRAIN_RUNS: set[str] = set()


def build_evaluator(ctx: RunContext, *, weights_ref: Any, data_ref: Any, ledger: Any) -> TorchTrainer:
    """A TorchTrainer that scores a model on the validation set over the configured workers (no checkpoints)."""
    from elastic_train.train.worker import evaluate_loop_per_worker

    cfg = ctx.cfg
    _ray_train_env(ctx)
    trainer = _Trainer(
        evaluate_loop_per_worker,
        train_loop_config={"config": cfg.model_dump(mode="json"), "weights_ref": weights_ref, "data_ref": data_ref,
                           "ledger": ledger},
        torch_config=LightTorchConfig(),
        scaling_config=_scaling(ctx, cfg.scaling.max_workers),
        run_config=_run_config(ctx),
    )
    trainer.placement_groups_reaped = ctx.embedded_ray
    return trainer


# What _ray_train_env last wrote into each of Ray Train's knobs. A value there that differs (or one found before
# our first write) is the user's: exported before the process started, or set since (a notebook between two runs).
_WRITTEN: dict[str, str] = {}


def spare_worker_env(env_vars: dict[str, str]) -> dict[str, str]:
    """The Train workers' setup hook and spare marker (train/spares.py), unless the job has a hook of its own
    (a ``worker_process_setup_hook`` given to ``ray.init`` or ``ray job submit``: it wins)."""
    import ray

    job_env = dict(ray.get_runtime_context().runtime_env.get("env_vars") or {}) if ray.is_initialized() else {}
    hook = job_env.get(SETUP_HOOK_ENV) or os.environ.get(SETUP_HOOK_ENV)
    return worker_env(SETUP_HOOK_ENV, {**env_vars, **({SETUP_HOOK_ENV: hook} if hook else {})})


def _ray_train_env(ctx: RunContext) -> None:
    """Ray Train's environment knobs (compat/ray_train.py), set in the driver, which propagates them to the
    controller; a value the user set wins, the latest one (it is not ours: not what this function last wrote). Set
    from *this* run's config each time, so that a second run in one process (a notebook, a test session, sweep
    trials) does not inherit the first run's values."""
    cfg = ctx.cfg
    values: dict[str, Any] = {
        # The controller polls workers at this period; report() waits for the poll, so the default 2 s makes
        # every checkpoint cost ~2 s.
        HEALTH_CHECK_ENV: cfg.failure.health_check_interval_s,
        # After a node loss Ray's view of the cluster can lag (its coordinator refreshes every 20 s) and a first
        # restart may ask for workers that no longer fit; a shorter start timeout retries sooner.
        START_TIMEOUT_ENV: cfg.failure.worker_start_timeout_s,
        # Ray Train starts a PreemptionWatcher actor (a new process) at every worker-group start, restarts
        # included, to log a node's drain ahead of its loss. An embedded Ray is one node, the driver's own:
        # nothing drains it but the driver's end. Off there (None: Ray's default, on, elsewhere).
        PREEMPTION_WATCHER_ENV: "0" if ctx.embedded_ray else None,
    }
    for name, value in values.items():
        current = os.environ.get(name)
        if current is not None and current != _WRITTEN.get(name):  # the user's: it wins
            _WRITTEN.pop(name, None)
        elif value is None:
            os.environ.pop(name, None)
            _WRITTEN.pop(name, None)
        else:
            os.environ[name] = _WRITTEN[name] = str(value)


def _preemption_watched() -> bool:
    """Whether Ray Train's controller will run a PreemptionWatcher (as it reads the knob: ``env_bool``); the
    workers skip the preemption barrier where none runs."""
    return os.environ.get(PREEMPTION_WATCHER_ENV, "1").lower() in ("1", "true")


def _scaling(ctx: RunContext, num_workers: int | tuple[int, int], **extra: Any) -> ScalingConfig:
    cfg, use_gpu = ctx.cfg, ctx.use_gpu
    return ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=worker_resources(cfg, use_gpu),
                         placement_strategy=cfg.scaling.placement_strategy, **extra)


def _run_config(ctx: RunContext, **extra: Any) -> RunConfig:
    path, filesystem = ray_storage(ctx.storage_path)
    return RunConfig(
        name=ctx.run_name, storage_path=path, storage_filesystem=filesystem,
        failure_config=FailureConfig(max_failures=ctx.cfg.failure.max_failures),
        # Ray Train's INFO lines repeat every report; our workers print restarts and resizes themselves.
        logging_config=LoggingConfig(log_level=os.environ.get("ELASTIC_TRAIN_RAY_LOG_LEVEL", "WARNING")),
        **extra,
    )
