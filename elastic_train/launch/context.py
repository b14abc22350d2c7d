"""The driver's side of a run, in the order ``jobs.train`` calls it.

    launch = plan_launch(config_path, overrides, resume)    # config, run name, storage; no Ray yet
    report = prepare(launch, address)                        # data/model built once, Ray connected, resources, storage
    spec = start_tracking(launch, report)                    # the one MLflow run (created or found)
    outcome = fit(launch, report, spec)                      # build_trainer(...).fit()
    summary = summarize(launch, outcome, spec)               # the summary JSON
    finish_tracking(launch, outcome, spec, summary, report)  # final model, status

Every bad input raises ConfigError before anything is acquired.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_train import config as config_mod
from elastic_train.config import ConfigError, JobConfig
from elastic_train.launch.storage import RunStorage, default_run_name, resolve_home, resolve_storage

log = logging.getLogger(__name__)


@dataclass
class Launch:
    cfg: JobConfig
    run_name: str
    home: Path
    storage_path: str
    resuming: bool
    config_path: str | None
    started: float = field(default_factory=time.time)


@dataclass
class Outcome:
    result: Any | None
    error: BaseException | None
    book: dict[str, Any] | None
    status: str  # FINISHED | FAILED | KILLED
    already_complete: dict[str, Any] | None = None


# ---------------------------------------------------------------------------------------- launch


def plan_launch(config_path: str | None, overrides: list[str], resume: str | None = None) -> Launch:
    """Resolve the config, run name and storage. ``--resume NAME`` starts from that run's stored config."""
    cfg = config_mod.load(config_path, overrides)
    home = resolve_home()
    storage_path = resolve_storage(cfg, home)
    if resume:
        storage = RunStorage(storage_path, resume)
        stored = storage.load_config() if storage.exists() else None
        if stored is None:
            raise ConfigError("--resume", resume, f"no run with this name in {storage_path}")
        tree = stored
        if config_path:
            tree = _deep_merge(tree, config_mod.read_yaml(config_path))
        for key, value in config_mod.parse_overrides(overrides).items():
            config_mod._set_dotted(tree, key, value)
        tree["name"] = resume
        cfg = config_mod.validate(tree)
    run_name = cfg.name or default_run_name(config_path, time.time())
    storage = RunStorage(storage_path, run_name)
    resuming = storage.has_checkpoints()
    if resuming:
        refuse_incompatible_resume(storage.load_config(), cfg)
    return Launch(cfg, run_name, home, storage_path, resuming, config_path)


# What a resumed run may not change: the checkpoint would not load, or the data position would mean other samples.
FROZEN_ON_RESUME = ("seed", "model.", "data.name", "data.path", "data.num_samples", "data.num_features",
                    "data.num_classes", "data.val_fraction", "data.options", "train.global_batch_size",
                    "scaling.strategy")


def refuse_incompatible_resume(stored: dict[str, Any] | None, cfg: JobConfig) -> None:
    """ConfigError naming the first setting that differs from the run being resumed, if it must not."""
    if not stored:
        return
    before = config_mod.flatten(config_mod.validate(stored))
    now = config_mod.flatten(cfg)
    for key, value in now.items():
        if key.startswith(FROZEN_ON_RESUME) and before.get(key) != value:
            raise ConfigError(key, value, f"differs from the run being resumed ({before.get(key)!r}); "
                                          "start a new run (another name) to change it")


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def connect_ray(address: str | None = None) -> str:
    """Connect to ``address`` / ``$RAY_ADDRESS``, else a head started with ``ray start``, else start one."""
    import ray

    if ray.is_initialized():
        return "already connected"
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    target = address or os.environ.get("RAY_ADDRESS")
    if target:
        ray.init(address=target, **kwargs)
        return f"cluster at {target}"
    try:
        ray.init(address="auto", **kwargs)
        return "local head (ray start)"
    except (ConnectionError, RuntimeError):
        ray.init(**kwargs)
        return "embedded local Ray"


# ---------------------------------------------------------------------------------------- preflight


def prepare(launch: Launch, address: str | None = None) -> Any:
    """Fail before acquiring anything, then connect and check the cluster; returns the preflight report.

    The data and the model are built once, on the driver, before Ray starts (a mistake is a ConfigError naming
    the field: exit 2, no cluster touched); the report carries the data bundle for the driver to reuse.
    """
    from elastic_train.launch.preflight import check_cluster, check_static

    bundle, n_params = check_static(launch.cfg)
    print(f"ray: {connect_ray(address)}")
    report = check_cluster(launch.cfg, launch.storage_path, bundle, n_params)
    report.bundle = bundle  # the driver reuses it for the model's input example
    return report


# ---------------------------------------------------------------------------------------- tracking


def start_tracking(launch: Launch, report: Any, kind: str = "train", parent_run_id: str | None = None) -> Any:
    """Create or find the run; log the resolved config, batch plan, versions and cluster. None if disabled."""
    from tracking.runs import TrackingUnavailable, check_reachable, environment_params, resolve_uri, start_run

    t = launch.cfg.tracking
    if not t.enabled:
        return None
    uri = resolve_uri(t.uri, launch.home)
    try:
        check_reachable(uri)
        spec, resumed = start_run(
            uri, t.experiment, launch.run_name,
            artifact_root=launch.home / "mlartifacts",
            spool_path=_spool_path(launch),
            kind=kind, parent_run_id=parent_run_id,
            system_metrics=t.system_metrics, log_every_steps=t.log_every_steps,
        )
    except TrackingUnavailable as e:
        if t.required:
            raise ConfigError("tracking.uri", uri, f"{e}; set tracking.required=false to train without it") from None
        log.warning("tracking disabled for this run: %s", e)
        return None
    from tracking.mlflow_tracker import MlflowTracker

    tracker = MlflowTracker(spec, start_system_metrics=False)
    params = {**config_mod.flatten(launch.cfg), **environment_params()}
    params.update({f"cluster.{k}": v for k, v in {"cpus": report.total_cpus, "gpus": report.total_gpus,
                                                   "nodes": len(report.nodes)}.items()})
    params["plan.steps_per_epoch"] = report.data["train_samples"] // launch.cfg.train.global_batch_size
    if resumed:  # params are immutable in MLflow; a resume may legitimately change a few (e.g. epochs)
        params = {k: v for k, v in params.items() if not k.startswith(("env.", "cluster."))}
    tracker.log_params(_immutable_safe(spec, params) if resumed else params)
    tracker.set_tags({"storage": RunStorage(launch.storage_path, launch.run_name).uri(), "resumed": resumed})
    tracker.close(timeout_s=30)
    return spec


def _immutable_safe(spec: Any, params: dict[str, Any]) -> dict[str, Any]:
    """On resume, only params the run does not have yet (changing a logged param is an MLflow error)."""
    from mlflow.tracking import MlflowClient

    existing = MlflowClient(tracking_uri=spec.uri).get_run(spec.run_id).data.params
    return {k: v for k, v in params.items() if k not in existing}


def _spool_path(launch: Launch) -> Path:
    if "://" in launch.storage_path:
        return launch.home / "results" / launch.run_name / "mlflow_unsent.jsonl"
    return Path(launch.storage_path) / launch.run_name / "mlflow_unsent.jsonl"


# ---------------------------------------------------------------------------------------- fit


def fit(launch: Launch, report: Any, spec: Any, fault: str | None = None, callbacks: list[Any] | None = None) -> Outcome:
    """Run the trainer; failures become an Outcome (the summary and MLflow status must still be written)."""
    import ray

    from elastic_train.launch.ledger import create_ledger
    from elastic_train.launch.trainer import build_trainer

    storage = RunStorage(launch.storage_path, launch.run_name)
    latest = storage.latest_checkpoint()
    if latest and latest[1].get("progress", {}).get("epoch", 0) >= launch.cfg.train.epochs:
        return Outcome(None, None, None, "FINISHED", already_complete={"checkpoint": latest[0], "meta": latest[1]})
    storage.save_config(launch.cfg.model_dump(mode="json"))
    cbs = list(callbacks or [])
    if spec is not None and launch.cfg.tracking.log_checkpoints != ["none"]:
        from tracking.checkpoints import MlflowCheckpointCallback

        c = launch.cfg.checkpoint
        cbs.append(MlflowCheckpointCallback(spec, launch.cfg.tracking.log_checkpoints, c.score, c.score_mode))
    log_floor = -1
    if spec is not None and launch.resuming:
        from tracking.runs import last_logged_step

        log_floor = last_logged_step(spec.uri, spec.run_id)
    ledger = create_ledger()
    trainer = build_trainer(
        launch.cfg, run_name=launch.run_name, storage_path=launch.storage_path, use_gpu=report.use_gpu,
        tracking=spec, ledger=ledger, log_floor=log_floor, fault=fault, callbacks=cbs,
        data_ref=share_data(report.bundle),
    )
    result = error = None
    status = "FINISHED"
    # Ray Train's fit() installs a SIGINT handler holding the controller's handle and leaves it installed:
    # an in-process caller (a notebook, a test session) would keep that controller, and through it the
    # ledger, alive until the next fit. Put the caller's handler back.
    sigint = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    try:
        result = trainer.fit()
    except KeyboardInterrupt as e:
        error, status = e, "KILLED"
    except Exception as e:  # noqa: BLE001 - TrainingFailedError and friends: report, don't crash
        error, status = e, "FAILED"
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)
    if result is not None and getattr(result, "error", None) is not None:
        error, status = result.error, "FAILED"
    book = None
    try:
        book = ray.get(ledger.get.remote(), timeout=10)
    except Exception:  # noqa: BLE001 - the ledger is accounting only
        pass
    ray.kill(ledger)  # done: nothing else may hold it (the controller's copy of the handle is a borrow)
    return Outcome(result, error, book, status)


def share_data(bundle: Any) -> Any | None:
    """Put the driver's dataset in the object store so workers skip rebuilding it (None if it won't pickle)."""
    import ray

    from elastic_train.data import TensorSet

    if bundle is None or not (isinstance(bundle.train, TensorSet) and isinstance(bundle.val, TensorSet)):
        return None
    return ray.put(bundle)


# ---------------------------------------------------------------------------------------- summary


def summarize(launch: Launch, outcome: Outcome, spec: Any) -> dict[str, Any]:
    if outcome.already_complete:
        m = outcome.already_complete["meta"].get("metrics", {})
        checkpoint = outcome.already_complete["checkpoint"]
    else:
        res = outcome.result
        m = dict(res.metrics or {}) if res is not None else {}
        checkpoint = res.checkpoint.path if res is not None and res.checkpoint else None
    book = outcome.book or {}
    totals = book.get("totals") or {}
    first = m.get("first_step_unix") or book.get("first_step_unix")
    summary: dict[str, Any] = {
        "status": outcome.status,
        "run_name": launch.run_name,
        "final_metrics": {k: m.get(k) for k in ("train_loss", "val_loss", "val_accuracy")},
        "params_sha256": m.get("params_sha256"),
        "world_sizes": m.get("world_sizes") or book.get("world_sizes") or [],
        "restarts": (m.get("goodput") or {}).get("restarts", totals.get("restarts", 0)),
        "steps": m.get("global_step"),
        "epochs": m.get("epoch"),
        "checkpoint": checkpoint,
        "storage_path": launch.storage_path,
        "mlflow_run_id": spec.run_id if spec else None,
        "tracking_uri": spec.uri if spec else None,
        "samples_per_second": m.get("samples_per_second"),
        "samples_per_second_median": m.get("samples_per_second_median"),
        "time_to_first_step_s": (first - launch.started) if first else None,
        "wall_s": time.time() - launch.started,
        "goodput": m.get("goodput") or totals,
        "tracking_unsent": m.get("tracking_unsent", 0),
        "tracking_spool": m.get("tracking_spool"),
    }
    if "val_perplexity" in m:
        summary["final_metrics"]["val_perplexity"] = m["val_perplexity"]
    for key in ("mfu", "tokens_per_second", "data_wait_share", "peak_memory_bytes"):
        summary[key] = m.get(key)
    if outcome.error is not None:
        summary["error"] = f"{type(outcome.error).__name__}: {str(outcome.error).strip().splitlines()[0][:500] if str(outcome.error).strip() else ''}"
    if outcome.already_complete:
        summary["note"] = "already complete; nothing to train"
    return summary


def finish_tracking(
    launch: Launch, outcome: Outcome, spec: Any, summary: dict[str, Any], report: Any, log_model: bool = True
) -> None:
    """Final model (FINISHED runs; ``log_model=False`` for sweep trials), summary metrics, terminal status."""
    if spec is None:
        return
    from tracking.mlflow_tracker import MlflowTracker
    from tracking.runs import end_run

    tracker = MlflowTracker(spec, start_system_metrics=False)
    final = {f"final_{k}": v for k, v in summary["final_metrics"].items() if isinstance(v, int | float)}
    goodput = {f"goodput_{k}": v for k, v in (summary.get("goodput") or {}).items() if isinstance(v, int | float)}
    step = summary.get("steps") or 0
    tracker.log_metrics({**final, **goodput, "restarts": summary["restarts"]}, step=step)
    tracker.set_tags({"world_sizes": summary["world_sizes"], "status_detail": summary.get("error", "ok")})
    if log_model and outcome.status == "FINISHED" and summary.get("checkpoint") and not outcome.already_complete:
        try:
            summary.update(_log_model(launch, spec, summary["checkpoint"], report))
        except Exception as e:  # noqa: BLE001 - the run trained; a model upload failure is reported, not fatal
            summary["model_error"] = f"{type(e).__name__}: {e}"
    leftover = tracker.close(timeout_s=60)
    if leftover["unsent"]:
        summary["tracking_unsent"] = summary.get("tracking_unsent", 0) + leftover["unsent"]
        summary["tracking_spool"] = leftover["spool_path"]
    try:
        end_run(spec.uri, spec.run_id, outcome.status)
    except Exception as e:  # noqa: BLE001
        summary["tracking_error"] = f"could not set the run status: {e}"


def _log_model(launch: Launch, spec: Any, checkpoint_uri: str, report: Any) -> dict[str, Any]:
    from ray.train import Checkpoint

    from elastic_train.data import as_numpy_example
    from elastic_train.train.state import load_model
    from tracking.models import log_final_model

    with Checkpoint(checkpoint_uri).as_directory() as d:
        model, cfg, meta = load_model(d)
    example = as_numpy_example(report.bundle) if getattr(report, "bundle", None) is not None else None
    metadata = {"elastic_train": {"config": cfg.model_dump(mode="json"), "data_spec": meta["data_spec"],
                                  "checkpoint": checkpoint_uri, "run_name": launch.run_name}}
    return log_final_model(spec.uri, spec.run_id, model, example, launch.cfg.tracking.register_model, metadata)


# ---------------------------------------------------------------------------------------- output


def render_summary(summary: dict[str, Any]) -> str:
    fm = summary["final_metrics"]
    rows = [
        ("run", summary["run_name"]),
        ("status", summary["status"]),
        *[(k, _fmt(v)) for k, v in fm.items()],
        ("steps / epochs", f"{summary['steps']} / {summary['epochs']}"),
        ("world sizes", " -> ".join(map(str, summary["world_sizes"])) or "-"),
        ("restarts", summary["restarts"]),
        ("samples/s (steady)", _fmt(summary["samples_per_second"], ",.0f")),
        ("time to first step", _fmt(summary["time_to_first_step_s"], ".1f", " s")),
        ("wall", _fmt(summary["wall_s"], ".1f", " s")),
        ("goodput", _fmt((summary.get("goodput") or {}).get("goodput_ratio"), ".1%")),
        ("checkpoint", summary["checkpoint"] or "-"),
        ("mlflow run", f"{summary['mlflow_run_id']} @ {summary['tracking_uri']}" if summary["mlflow_run_id"] else "off"),
        ("params sha256", (summary["params_sha256"] or "-")[:16]),
    ]
    if summary.get("mfu") is not None:
        rows.append(("MFU", _fmt(summary["mfu"], ".1%")))
    if summary.get("tracking_unsent"):
        rows.append(("unsent metrics", f"{summary['tracking_unsent']} in {summary['tracking_spool']}"))
    if summary.get("error"):
        rows.append(("error", summary["error"]))
    width = max(len(k) for k, _ in rows)
    return "\n".join(["=" * 72, *(f"{k:<{width}}  {v}" for k, v in rows), "=" * 72])


def _fmt(v: Any, spec: str = ".4f", unit: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:{spec}}{unit}" if isinstance(v, int | float) else str(v)
