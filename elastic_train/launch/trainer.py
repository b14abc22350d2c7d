"""``build_trainer(cfg, ...) -> TorchTrainer``: the one way a run is built (train and sweep share it)."""

from __future__ import annotations

import os
import sys
from typing import Any

import ray.train
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from elastic_train.compat import features
from elastic_train.compat.ray_core import SETUP_HOOK_ENV
from elastic_train.compat.ray_train import HEALTH_CHECK_ENV, PREEMPTION_WATCHER_ENV, START_TIMEOUT_ENV
from elastic_train.config import JobConfig
from elastic_train.launch.context import RunContext
from elastic_train.launch.controller import (
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
        run_store=run_store(ctx),
    )
    # every process of the run sees the same switch of internals (compat/features.py)
    env_vars = {**(dict(tracking.env) if tracking else {}), **features.process_env()}
    if cfg.failure.spare_workers != 0 and features.enabled("warm_spares"):  # train/spares.py
        env_vars.update(spare_worker_env(env_vars))
    trainer = _Trainer(
        train_loop_per_worker,
        train_loop_config=dict(vars(args)),  # shallow: the resources hold actor handles
        torch_config=torch_config(),
        scaling_config=_scaling(ctx, ray_num_workers(cfg),
                                elastic_resize_monitor_interval_s=cfg.scaling.resize_check_interval_s),
        run_config=_run_config(
            ctx,
            checkpoint_config=CheckpointConfig(
                num_to_keep=cfg.checkpoint.keep,
                checkpoint_score_attribute=cfg.checkpoint.score,
                checkpoint_score_order=cfg.checkpoint.score_mode,
            ),
            callbacks=[*engine_callbacks(ctx, res.run_folder), *res.callbacks],
            worker_runtime_env={"env_vars": env_vars},
        ),
    )
    trainer.scaling_policy = res.scaling_policy
    reaped = res.placement_groups_reaped
    trainer.placement_groups_reaped = ctx.embedded_ray if reaped is None else reaped
    trainer.ray_data = cfg.data.name == "ray"
    return trainer


def engine_callbacks(ctx: RunContext, run_folder: str | None = None) -> list[Any]:
    """The engine's own Ray Train callbacks, each of an internal kind and so each behind its feature
    (compat/features.py); with every internal off, none: Ray Train's public path alone."""
    markers = FaultPlan.parse(ctx.fault).markers  # restart timing for the benchmarks (docs/faults.md)
    ours: list[Any] = []
    if features.enabled("worker_warmup"):
        features.note("worker_warmup")
        ours.append(WorkerWarmup(markers))
    if ctx.cfg.scaling.elastic and features.enabled("dead_run_requests"):  # only elastic runs reserve workers
        features.note_entries("dead_run_requests", "ControllerCallback")
        ours.append(RecordTrainRun(run_folder))
    if ctx.cfg.scaling.elastic and features.enabled("fresh_cluster_view"):
        features.note("fresh_cluster_view")
        ours.append(FreshClusterView())
    if markers and features.enabled("restart_markers"):
        features.note("restart_markers")
        ours.append(RestartPhases(markers))
    return ours


def torch_config() -> Any:
    """Ray's ``TorchConfig``, or with ``light_controller`` the same without torch in the controller's process
    (compat/torch_backend.py)."""
    if features.enabled("light_controller"):
        from elastic_train.compat.torch_backend import LightTorchConfig

        features.note("light_controller")
        return LightTorchConfig()
    return TorchConfig()


class _Trainer(TorchTrainer):
    """TorchTrainer whose Train controller can get another scaling policy than Ray's default for its config
    (``scaling_policy``: ScalingConfig -> policy; Ray's own when None). Ray builds the policy here, in the driver,
    and hands it to the controller actor. Fewer helper processes than Ray starts (launch/controller.py): none to
    hand out datasets when there are none, and no PlacementGroupCleaner when ``placement_groups_reaped``."""

    scaling_policy: Any | None = None
    placement_groups_reaped: bool = False
    ray_data: bool = True  # the run reads Ray Data (data.name=ray): Ray Train's DatasetsCallback stays

    def _create_default_callbacks(self) -> list[Any]:
        callbacks = super()._create_default_callbacks()
        if not features.enabled("lean_callbacks"):
            return callbacks
        features.note("lean_callbacks")
        return leaner_default_callbacks(callbacks, keep_datasets=self.ray_data,
                                        keep_pg_cleaner=not self.placement_groups_reaped)

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        if self.scaling_policy is not None:  # an elastic trial's (sweep/elastic.py)
            features.note("elastic_trials")
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
        torch_config=torch_config(),
        scaling_config=_scaling(ctx, cfg.scaling.max_workers),
        run_config=_run_config(ctx, worker_runtime_env={"env_vars": features.process_env()}),
    )
    trainer.placement_groups_reaped = ctx.embedded_ray
    trainer.ray_data = cfg.data.name == "ray"
    return trainer


def spare_worker_env(env_vars: dict[str, str]) -> dict[str, str]:
    """The Train workers' setup hook and spare marker (train/spares.py), unless the job has a hook of its own
    (a ``worker_process_setup_hook`` given to ``ray.init`` or ``ray job submit``: it wins)."""
    import ray

    job_env = dict(ray.get_runtime_context().runtime_env.get("env_vars") or {}) if ray.is_initialized() else {}
    hook = job_env.get(SETUP_HOOK_ENV) or os.environ.get(SETUP_HOOK_ENV)
    features.note_entries("warm_spares", "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", "load_and_execute_setup_hook_module")
    return worker_env(SETUP_HOOK_ENV, {**env_vars, **({SETUP_HOOK_ENV: hook} if hook else {})})


def _ray_train_env(ctx: RunContext) -> None:
    """Ray Train's environment knobs (compat/ray_train.py, features ``train_knobs`` and ``no_preemption_watcher``),
    set in the driver, which propagates them to the controller. Set from *this* run's config each time, so that a
    second run in one process (a notebook, a test session, sweep trials) does not inherit the first run's values;
    a value the user set wins, also one set between two runs (what this process last wrote is remembered, so a
    different value is the user's)."""
    cfg = ctx.cfg
    values: dict[str, Any] = {}
    if features.enabled("train_knobs"):
        features.note("train_knobs")
        # The controller polls workers at this period; report() waits for the poll, so the default 2 s makes
        # every checkpoint cost ~2 s.
        values[HEALTH_CHECK_ENV] = cfg.failure.health_check_interval_s
        # After a node loss Ray's view of the cluster can lag (its coordinator refreshes every 20 s) and a first
        # restart may ask for workers that no longer fit; a shorter start timeout retries sooner.
        values[START_TIMEOUT_ENV] = cfg.failure.worker_start_timeout_s
    if ctx.embedded_ray and features.enabled("no_preemption_watcher"):
        # Ray Train starts a PreemptionWatcher actor (a new process) at every worker-group start, restarts
        # included, to log a node's drain ahead of its loss. An embedded Ray is one node, the driver's own:
        # nothing drains it but the driver's end.
        features.note("no_preemption_watcher")
        values[PREEMPTION_WATCHER_ENV] = "0"
    for name in (HEALTH_CHECK_ENV, START_TIMEOUT_ENV, PREEMPTION_WATCHER_ENV):
        current = os.environ.get(name)
        if current is not None and current != _WRITTEN.get(name):
            continue  # the user's (exported before this process, or set since our last write)
        if name in values:
            os.environ[name] = _WRITTEN[name] = str(values[name])
        elif name in _WRITTEN:  # ours from an earlier run, not wanted by this one: Ray's default again
            os.environ.pop(name, None)
            del _WRITTEN[name]


_WRITTEN: dict[str, str] = {}  # what _ray_train_env last set, per knob


def _preemption_watched() -> bool:
    """Whether Ray Train's controller will run a PreemptionWatcher (Ray 2.58 and newer, unless the knob turns it off,
    as Ray reads it: ``env_bool``); the workers skip the preemption barrier where none runs."""
    return hasattr(ray.train, "get_preemption_info") and \
        os.environ.get(PREEMPTION_WATCHER_ENV, "1").lower() in ("1", "true")


def _scaling(ctx: RunContext, num_workers: int | tuple[int, int], **extra: Any) -> ScalingConfig:
    cfg, use_gpu = ctx.cfg, ctx.use_gpu
    return ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=worker_resources(cfg, use_gpu),
                         placement_strategy=cfg.scaling.placement_strategy, **extra)


def _run_config(ctx: RunContext, **extra: Any) -> RunConfig:
    path, filesystem = ray_storage(ctx.storage_path)
    return RunConfig(
        name=ctx.run_name, storage_path=path, storage_filesystem=filesystem,
        failure_config=FailureConfig(max_failures=ctx.cfg.failure.max_failures),
        **_logging_config(),
        **extra,
    )


def run_store(ctx: RunContext) -> tuple[Any, str]:
    """The run's folder as Ray Train lays it out (``storage_path/name``), with the filesystem RunConfig gets: the
    workers list, fence and upload checkpoints there (train/worker.py)."""
    import pyarrow.fs

    path, filesystem = ray_storage(ctx.storage_path)
    if filesystem is None:
        filesystem, path = pyarrow.fs.LocalFileSystem(), os.path.abspath(path)
    return filesystem, f"{path.rstrip('/')}/{ctx.run_name}"


def _logging_config() -> dict[str, Any]:
    """Ray Train's console level (its public ``LoggingConfig``, Ray 2.56 and newer): its INFO lines repeat every
    report, and its warnings as it shuts down a failed worker group are a traceback; our workers print restarts
    and resizes themselves. The controller's log files keep every level. ``$ELASTIC_TRAIN_RAY_LOG_LEVEL`` sets it."""
    logging_config = getattr(ray.train, "LoggingConfig", None)
    if logging_config is None:
        return {}
    return {"logging_config": logging_config(log_level=os.environ.get("ELASTIC_TRAIN_RAY_LOG_LEVEL", "ERROR"))}
