"""The run context: what the driver learns about one run, built in stages, each a new immutable object.

    ctx = plan(config_path, overrides, resume)   # config, run name, storage; nothing acquired, no Ray
    ctx = connect(ctx, address)                   # data and model built once, Ray connected, cluster preflight
    ctx = track(ctx, kind="train")                # the one tracking run, created or found by name
    (prepare() is the three in a row; jobs.train, jobs.sweep and jobs.evaluate all start this way)

Every bad input raises ConfigError before anything is acquired (DESIGN invariant 7). The context is handed to
:func:`~elastic_train.launch.fit.fit`, :func:`~elastic_train.launch.summary.summarize` and
:func:`~elastic_train.launch.summary.finish`; nothing mutates it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.config import ConfigError, JobConfig
from elastic_train.data import DataBundle
from elastic_train.data.registry import precheck_on_cluster_source
from elastic_train.data.spec import source_of
from elastic_train.launch import timeline
from elastic_train.launch.gcs_store import watch_from_environment
from elastic_train.launch.preflight import PreflightReport
from elastic_train.launch.quiet import filter_forwarded_lines, quiet_ray_driver_logs
from elastic_train.launch.storage import RunStorage, default_run_name, resolve_home, resolve_storage
from elastic_train.train.faults import FaultPlan
from tracking import TrackingBackend, TrackingSpec, TrackingUnavailable, open_backend

log = logging.getLogger(__name__)

FAULT_ENV = "ELASTIC_TRAIN_FAULT"  # test-only fault injection, read once at launch and handed to the workers


@dataclass(frozen=True)
class RunContext:
    """One run as the driver knows it. Fields after ``started`` are filled by :func:`connect` and :func:`track`."""

    cfg: JobConfig
    run_name: str
    home: Path  # results and the embedded tracking store live here
    storage_path: str  # absolute path or URI holding <run_name>/
    resuming: bool  # the run has checkpoints: continue from the latest
    config_path: str | None
    started: float  # unix time of the launch (wall time and goodput count from here)
    fault: str | None = None
    ray_target: str | None = None  # how Ray was reached (connect)
    cluster: PreflightReport | None = None  # connect
    bundle: DataBundle | None = None  # the dataset, built once on the driver (connect)
    tracking: TrackingSpec | None = None  # the run's tracking handle (track); None when off

    @property
    def storage(self) -> RunStorage:
        return RunStorage(self.storage_path, self.run_name)

    @property
    def embedded_ray(self) -> bool:
        """Ray is this driver's own (started by :func:`connect_ray`): one node, gone with the driver."""
        from elastic_train.launch.reach import EMBEDDED

        return self.ray_target == EMBEDDED

    @property
    def use_gpu(self) -> bool:
        return bool(self.cluster and self.cluster.use_gpu)

    def header(self) -> str:
        """The console's first lines: the run, where Ray is, and the preflight report."""
        lines = [f"run {self.run_name}{' (resuming)' if self.resuming else ''}: storage {self.storage_path}"]
        if self.ray_target:
            lines.append(f"ray: {self.ray_target}")
        if self.cluster is not None:
            lines.append(self.cluster.render())
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------- plan


def plan(config_path: str | None, overrides: list[str], resume: str | None = None, *,
         stored: dict[str, Any] | None = None, name: str | None = None,
         launched: float | None = None) -> RunContext:
    """Resolve the config, run name and storage; no Ray. ``--resume NAME`` layers over that run's stored config.

    ``stored`` is another base config (``jobs.evaluate``: the one a model was trained with); ``name`` forces
    the run name. The file is read and the overrides are parsed once. ``launched`` is when the job started
    (``started``: its wall and goodput count from there); default now.
    """
    from elastic_train.launch.versions import check_installed

    check_installed()  # a Ray or MLflow outside the supported range: exit 2 with the line that fixes it
    file_tree = config_mod.read_yaml(config_path) if config_path else {}
    parsed = config_mod.parse_overrides(overrides)
    cfg = config_mod.compose(file_tree, parsed)  # on its own first: a mistake names the override, not the base
    home = resolve_home()
    storage_path = resolve_storage(cfg, home)
    if "://" in storage_path:  # object storage: endpoint, credentials, bucket checked (bounded) before anything
        from elastic_train.launch.preflight import check_uri_storage

        check_uri_storage(storage_path)
    if resume:
        stored = RunStorage(storage_path, resume).load_config()
        if stored is None:
            raise ConfigError("--resume", resume, f"no run with this name in {storage_path}")
        name = resume
    if stored is not None:
        cfg = config_mod.compose(file_tree, parsed, stored)
    if name is not None:
        cfg = config_mod.with_overrides(cfg, {"name": name})
    now = time.time()
    run_name = cfg.name or default_run_name(config_path, now)
    storage = RunStorage(storage_path, run_name)
    resuming = storage.has_checkpoints()
    if resuming:
        config_mod.refuse_incompatible_resume(storage.load_config(), cfg)
    use_internals(cfg)
    fault = os.environ.get(FAULT_ENV) or None
    FaultPlan.parse(fault)  # a malformed test-fault spec exits 2 here, not in a worker
    timeline.mark("config + plan")
    return RunContext(cfg, run_name, home, storage_path, resuming, config_path,
                      launched if launched is not None else now, fault=fault)


def use_internals(cfg: JobConfig) -> None:
    """The run's switch of upstream internals (``compat.internals``, else ``$ELASTIC_TRAIN_INTERNALS``) made this
    process's and its children's (compat/features.py); a bad value in the environment exits 2 here."""
    from elastic_train.compat import features

    features.configure(cfg.compat.internals)
    try:
        features.parse_switch(features.switch_value())
    except ValueError as e:
        raise ConfigError(f"${features.SWITCH_ENV}", features.switch_value(), str(e)) from None


# ---------------------------------------------------------------------------------------- connect


def connect_ray(address: str | None = None, timeout_s: float = 30.0, starts_cleaner: bool = True) -> str:
    """Connect to ``address`` / ``$RAY_ADDRESS``, else a live head started with ``ray start``, else start an
    embedded Ray. ``starts_cleaner``: whether the job's Train runs start Ray Train's PlacementGroupCleaner (then its
    processes may need ``RAY_ADDRESS``: :func:`reach.job_processes_env`).
    Never hangs: an address that does not answer within ``timeout_s`` raises ConfigError (exit 2);
    a stale head left in ``ray_current_cluster`` is one warning line (:mod:`elastic_train.launch.reach`)."""
    import ray

    from elastic_train.launch import reach

    if ray.is_initialized():  # a notebook's or a test's own ray.init: the same console filters
        quiet_ray_driver_logs()
        filter_forwarded_lines()
        return "already connected"
    target = reach.choose(address, timeout_s)
    if target.warning:
        log.warning("warning: %s", target.warning)
    quiet_ray_driver_logs()  # Ray's known-benign lines off the console (elastic_train.launch.quiet)
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    with keep_sigterm_handler(), warnings.catch_warnings():
        # Ray 2.55's FutureWarning on every ray.init that it will stop setting CUDA_VISIBLE_DEVICES for tasks that
        # ask for no GPU: nothing for a run to do (its GPU workers ask for theirs), and later Rays print none.
        warnings.filterwarnings("ignore", message="Tip: In future versions of Ray, Ray will no longer override",
                                category=FutureWarning)
        if target.embedded:
            embedded_ray_env()
            # never "auto": it would follow a stale ray_current_cluster again
            ray.init(address="local", include_dashboard=embedded_dashboard(), **kwargs)
        else:
            reach.check_auth(target)  # a token mismatch: exit 2 in seconds, not 20 s of InvalidAuthToken lines
            env = reach.job_processes_env(target, ray.util.get_node_ip_address, starts_cleaner=starts_cleaner)
            try:
                reach.bounded(lambda: init_on_cluster(target.init_address(), env, kwargs), timeout_s,
                              target.source, target.address)
            except RuntimeError as e:  # the cluster's Ray is another release: one line, the install that matches
                from elastic_train.launch.versions import cluster_mismatch

                raise (cluster_mismatch(e, target.address) or e) from None
    filter_forwarded_lines()
    watch_from_environment()  # a head with GCS fault tolerance: its Redis going away is one line (gcs_store)
    return target.how


def init_on_cluster(address: str | None, env: dict[str, str], kwargs: dict[str, Any]) -> None:
    """``ray.init`` to a cluster, the job's processes given ``env`` (:func:`reach.job_processes_env`). A submitted
    job whose own runtime env sets one of those variables keeps its value: Ray refuses to merge the two."""
    import ray

    try:
        ray.init(address=address, runtime_env={"env_vars": env}, **kwargs)
    except ValueError as e:
        if not str(e).startswith("Failed to merge the Job's runtime env"):
            raise
        log.info("the job's runtime env sets %s itself: kept (%s)", ", ".join(env), e)
        ray.init(address=address, **kwargs)


# Ray's public settings for the Ray a driver starts itself (its raylet reads them from its environment; a value the
# user exported wins). Ray starts every worker process at niceness 15 (RayConfig ``worker_niceness``): a training
# worker that fills the cores then loses each time slice to any nice-0 process that wakes up, and with intra-op
# threads one preempted thread stalls the op (on 2 cores, the MLP at 0.69 of a plain loop, the small GPT at 0.86).
# An embedded Ray serves one run on one machine: no usage report to Anyscale (``RAY_USAGE_STATS_ENABLED``) and no
# Prometheus metrics that nothing scrapes (``enable_metrics_collection``); both are periodic work beside the
# training worker on every node process (docs/benchmarks.md, "Embedded Ray").
EMBEDDED_RAY_ENV = {"RAY_worker_niceness": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0"}


def embedded_ray_env() -> None:
    for name, value in EMBEDDED_RAY_ENV.items():
        os.environ.setdefault(name, value)


def embedded_dashboard() -> bool:
    """Whether an embedded Ray starts its dashboard (``ray.init(include_dashboard=...)``): only where something
    of the run may need its state API, which is Ray Train's ``PlacementGroupCleaner`` when it is kept (without the
    internal feature ``lean_callbacks``, or a sweep's trials without ``sweep_reaper``). The dashboard and its agent
    are two more Python processes polling beside the worker; for Ray's dashboard, start a head
    (``cluster/local/start-head.sh``) and run against it."""
    from elastic_train.compat import features

    return not (features.enabled("lean_callbacks") and features.enabled("sweep_reaper"))


@contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """The job's own SIGTERM handler (``jobs._cli.guarded``: the run ends KILLED, exit 130) still in force after
    ``ray.init``, which replaces it twice: with its own Python handler (``sys.exit``) and, process-wide, with
    abseil's failure handler from Ray's core worker. That one prints a C++ stack, arms a 3 s alarm and chains to
    the Python handler; a run's orderly end (the Train run stopped, MLflow marked KILLED, Ray shut down) takes
    longer, so the alarm aborted the driver: exit 134, the run's end unwritten (ray#64830). Setting the job's
    handler again after ``ray.init`` replaces both, for SIGTERM only (abseil keeps SIGSEGV and the rest). A
    process with no Python handler of its own (a library caller) keeps Ray's."""
    import signal

    main = threading.current_thread() is threading.main_thread()
    ours = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if callable(ours):
            signal.signal(signal.SIGTERM, ours)


def connect(ctx: RunContext, address: str | None = None, starts_cleaner: bool = True) -> RunContext:
    """Build the data and the model once on the driver (a mistake exits 2, no cluster touched), then connect to
    Ray and check the cluster: nodes, resources, storage."""
    from elastic_train.launch.preflight import check_cluster, check_static, check_stream_cpus_first

    def build() -> tuple[DataBundle, int]:
        built = check_static(ctx.cfg)
        timeline.mark("data + model build")
        return built

    def ray_start() -> str:
        how = connect_ray(address, ctx.cfg.failure.connect_timeout_s, starts_cleaner)
        timeline.mark("ray start")
        return how

    if precheck_on_cluster_source(ctx.cfg):  # read on the cluster (Ray Data): files checked, then Ray, then build
        target = ray_start()
        check_stream_cpus_first(ctx.cfg)  # before the build's counting pass over a streamed data set
        bundle, n_params = build()
    else:  # built here first: a mistake in the data or the model exits 2 before any cluster is touched
        bundle, n_params = build()
        target = ray_start()
    report = check_cluster(ctx.cfg, ctx.storage_path, bundle, n_params)
    timeline.mark("cluster preflight")
    return replace(ctx, ray_target=target, cluster=report, bundle=bundle)


def disconnect_ray(ctx: RunContext) -> None:
    """Stop the embedded Ray this run started, or leave the cluster it joined (counted in the run's teardown,
    before the summary prints, rather than after it at interpreter exit); a caller's Ray stays connected."""
    import ray

    if ctx.ray_target not in (None, "already connected") and ray.is_initialized():
        ray.shutdown()
        timeline.mark("ray shutdown")


# ---------------------------------------------------------------------------------------- track


def tracking_backend(ctx: RunContext) -> TrackingBackend:
    t = ctx.cfg.tracking
    return open_backend(t.backend, t.uri, ctx.home)


def track(ctx: RunContext, kind: str = "train", parent_run_id: str | None = None) -> RunContext:
    """Create or find the run; log the resolved config, batch plan, versions and cluster."""
    t = ctx.cfg.tracking
    if not t.enabled:
        return ctx
    backend = tracking_backend(ctx)
    try:
        backend.check()
        dataset = vars(source_of(ctx.bundle, ctx.cfg.data.name)) if ctx.bundle is not None else None
        spec = open_run(ctx, backend, kind=kind, parent_run_id=parent_run_id, dataset=dataset)
    except TrackingUnavailable as e:
        if t.required:
            raise ConfigError(
                "tracking.uri", backend.uri, f"{e}; set tracking.required=false to train without it"
            ) from None
        log.warning("tracking disabled for this run: %s", e)
        return ctx
    timeline.mark("mlflow run")
    return replace(ctx, tracking=spec)


def open_run(ctx: RunContext, backend: TrackingBackend, *, kind: str, parent_run_id: str | None = None,
             dataset: dict[str, Any] | None = None, env_params: dict[str, str] | None = None) -> TrackingSpec:
    """Create (or find by name and storage) ``ctx``'s run in ``backend`` and log its params (config, versions,
    cluster, batch plan), tags and dataset input. Raises TrackingUnavailable. ``env_params``: the versions, when
    the caller has them already (a sweep's driver opens every trial's run)."""
    t = ctx.cfg.tracking
    spec, resumed = backend.start_run(
        t.experiment, ctx.run_name, kind=kind, spool_path=_spool_path(ctx), parent_run_id=parent_run_id,
        system_metrics=t.system_metrics, log_every_steps=t.log_every_steps, storage=ctx.storage.uri(),
    )
    params = {**config_mod.flatten(ctx.cfg), **(env_params if env_params is not None else backend.environment_params())}
    if ctx.cluster is not None:
        c = ctx.cluster
        params.update({"cluster.cpus": c.total_cpus, "cluster.gpus": c.total_gpus, "cluster.nodes": len(c.nodes)})
        params["plan.steps_per_epoch"] = c.data["train_samples"] // ctx.cfg.train.global_batch_size
    if resumed:  # params are immutable; a resume may legitimately change a few (e.g. epochs): log only new ones
        existing = backend.logged_params(spec)
        params = {k: v for k, v in params.items() if not k.startswith(("env.", "cluster.")) and k not in existing}
    writer = backend.writer(spec)
    writer.log_params(params)
    writer.set_tags({"storage": ctx.storage.uri(), "resumed": resumed})
    writer.close(timeout_s=30)
    if dataset is not None:  # the run page's Datasets panel: source URI, schema, digest, row count
        try:
            backend.log_dataset(spec, dataset)
        except Exception as e:  # a missing dataset entry must not stop a run
            log.warning("could not record the dataset input: %s", e)
    return spec


def local_run_folder(ctx: RunContext) -> Path:
    """The run's folder on this node: its storage folder when that is a path, else ``<home>/results/<run>``
    (object storage). The tracking spool and the run's log (elastic_train/runlog.py) live there."""
    if "://" in ctx.storage_path:
        return ctx.home / "results" / ctx.run_name
    return Path(ctx.storage_path) / ctx.run_name


def _spool_path(ctx: RunContext) -> Path:
    return local_run_folder(ctx) / "mlflow_unsent.jsonl"


def prepare(config_path: str | None, overrides: list[str], resume: str | None = None,
            address: str | None = None, launched: float | None = None) -> RunContext:
    """:func:`plan`, :func:`connect` and :func:`track`: everything before ``fit``.

    The tracking store is opened (MLflow imported, a sqlite store created) in a thread while the data is built
    and Ray starts; :func:`track` then only creates the run. A failure there is left for :func:`track` to report.
    """
    ctx = plan(config_path, overrides, resume, launched=launched)
    return track(connect_warming_store(ctx, address))


def connect_warming_store(ctx: RunContext, address: str | None = None, starts_cleaner: bool = True) -> RunContext:
    """:func:`connect`, with the tracking store opened in a thread meanwhile (jobs.train and jobs.sweep).
    ``starts_cleaner``: whether this job's Train runs start Ray Train's PlacementGroupCleaner
    (:func:`reach.job_processes_env`).

    Ray and torch are imported by now (this module imports preflight): the thread imports only MLflow's own
    modules, so the two threads do not race on one module graph's import locks."""
    warm = _open_store_in_background(ctx)
    ctx = connect(ctx, address, starts_cleaner)
    if warm is not None:
        warm.join(timeout=STORE_WARMUP_WAIT_S)
    return ctx


STORE_WARMUP_WAIT_S = 60.0  # then track() opens the store itself, with its own bounded checks


def _open_store_in_background(ctx: RunContext) -> threading.Thread | None:
    t = ctx.cfg.tracking
    if not t.enabled:
        return None

    def open_store() -> None:
        try:
            backend = tracking_backend(ctx)
            backend.check()
            prepare_store = getattr(backend, "prepare_store", None)
            if prepare_store is not None:
                prepare_store(t.experiment)
        except Exception:  # track() repeats this and reports what is wrong
            pass

    thread = threading.Thread(target=open_store, name="elastic-train-open-store", daemon=True)
    thread.start()
    return thread
