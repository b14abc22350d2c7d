"""After ``fit``: the run summary, the console's summary table, and closing the tracking run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from elastic_train.data import as_numpy_example
from elastic_train.data.prepare import TOKENIZER
from elastic_train.launch import timeline
from elastic_train.launch.context import RunContext
from elastic_train.launch.fit import Outcome
from elastic_train.launch.storage import checkpoint_uri
from elastic_train.train.goodput import wall_parts
from tracking import TrackingSpec, backend_for


def summarize(ctx: RunContext, outcome: Outcome) -> dict[str, Any]:
    """The run summary (``--summary-json``): final metrics, fingerprint, world sizes, goodput, where things are."""
    spec = ctx.tracking
    if outcome.already_complete:
        m = outcome.already_complete["meta"].get("metrics", {})
        checkpoint = outcome.already_complete["checkpoint"]
    else:
        res = outcome.result
        m = dict(res.metrics or {}) if res is not None else {}
        has_checkpoint = res is not None and res.checkpoint
        checkpoint = checkpoint_uri(ctx.storage_path, res.checkpoint.path) if has_checkpoint else None
        if res is None:  # killed or failed with no result from Ray Train: where the same command resumes from
            latest = _latest_checkpoint(ctx)  # (its progress only: the run's final metrics are not this)
            if latest is not None:
                checkpoint = latest[0]
                m = {k: v for k, v in (latest[1].get("metrics") or {}).items()
                     if k in ("global_step", "steps_per_epoch", "epoch")}
    book = outcome.book or {}
    totals = book.get("totals") or {}
    # this driver's first step only (an already-complete run's checkpoint holds an earlier driver's)
    first = book.get("first_step_unix") or (None if outcome.already_complete else m.get("first_step_unix"))
    summary: dict[str, Any] = {
        "status": outcome.status,
        "run_name": ctx.run_name,
        "final_metrics": {k: m.get(k) for k in ("train_loss", "val_loss", "val_accuracy")},
        "params_sha256": m.get("params_sha256"),
        "world_sizes": m.get("world_sizes") or book.get("world_sizes") or [],
        "restarts": (m.get("goodput") or {}).get("restarts", totals.get("restarts", 0)),
        "steps": m.get("global_step"),
        "epochs": m.get("epoch"),  # whole epochs completed
        "epochs_run": epochs_run(m.get("global_step"), m.get("steps_per_epoch"), m.get("epoch")),
        "checkpoint": checkpoint,
        "storage_path": ctx.storage_path,
        "mlflow_run_id": spec.run_id if spec else None,
        "tracking_uri": spec.uri if spec else None,
        "samples_per_second": m.get("samples_per_second"),
        "samples_per_second_median": m.get("samples_per_second_median"),
        "time_to_first_step_s": (first - ctx.started) if first and first >= ctx.started else None,
        "first_step_unix": first if first and first >= ctx.started else None,
        "wall_s": time.time() - ctx.started,
        "goodput": {},  # account() fills it: this driver's wall in parts
        "goodput_run": m.get("goodput") or totals,  # the run's book, cumulative over restarts and resumes
        "checkpoint_interval": m.get("checkpoint_interval"),  # checkpoint.every_steps=auto: the last choice
        "behind_storage": behind_storage(m.get("goodput"), totals),
        "tracking_unsent": m.get("tracking_unsent", 0),
        "tracking_spool": m.get("tracking_spool"),
        # checkpoint copies into the tracking run that were not sent (or not made): each printed a warning
        "checkpoint_copies_unsent": (outcome.tracking_copies or {}).get("unsent", 0),
    }
    if "val_perplexity" in m:
        summary["final_metrics"]["val_perplexity"] = m["val_perplexity"]
    for key in ("mfu", "tokens_per_second", "data_wait_share", "peak_memory_bytes"):
        summary[key] = m.get(key)
    if isinstance(outcome.error, KeyboardInterrupt):  # Ctrl-C, or SIGTERM (`ray job stop`, a scheduler)
        summary["error"] = "interrupted (Ctrl-C or SIGTERM): the same command resumes from the last checkpoint"
    elif outcome.error is not None:
        summary["error"] = (
            f"{type(outcome.error).__name__}: "
            f"{str(outcome.error).strip().splitlines()[0][:500] if str(outcome.error).strip() else ''}"
        )
    if outcome.already_complete:
        summary["note"] = "already complete; nothing to train"
    account(ctx, outcome, summary)
    return summary


def behind_storage(*books: dict[str, Any] | None) -> dict[str, Any] | None:
    """How far behind durable storage the run was at its worst (train/uploads.py): the most steps and seconds
    training was ahead of its newest durable checkpoint (what a failure then would have lost), and the mean time
    from a checkpoint's hand-off until it was durable. From the final checkpoint's book and the ledger's (which
    also holds the final upload); None when no upload was measured."""
    known = [b for b in books if b and b.get("uploads")]
    if not known:
        return None
    last = max(known, key=lambda b: b["uploads"])
    return {"worst_steps": max(int(b.get("behind_max_steps", 0)) for b in known),
            "worst_s": max(float(b.get("behind_max_s", 0.0)) for b in known),
            "uploads": int(last["uploads"]), "upload_s_mean": float(last["upload_s"]) / last["uploads"]}


def _latest_checkpoint(ctx: RunContext) -> tuple[str, dict[str, Any]] | None:
    try:
        return ctx.storage.latest_checkpoint()
    except Exception:  # the storage is away: the summary says less, it still prints
        return None


def epochs_run(global_step: int | None, steps_per_epoch: int | None, epoch: int | None) -> float | int | None:
    """Epochs as run, to two decimals: 400 steps of 292 per epoch is 1.37, where the completed ``epoch`` says 1.
    The global batch is frozen for a run, so steps per epoch hold over its restarts and resumes."""
    if global_step is None or not steps_per_epoch:
        return epoch
    return round(global_step / steps_per_epoch, 2)


def account(ctx: RunContext, outcome: Outcome, summary: dict[str, Any]) -> None:
    """Fill ``wall_s``, ``goodput`` (the wall in named parts, DESIGN invariant 9), ``startup`` and ``teardown``
    (phases and seconds) in ``summary``, as of now. Called again at the end of :func:`finish`. Without the
    goodput book (it could not be read: ``outcome.book_error``) the wall cannot be split: ``goodput`` says
    ``unknown`` and why, and the phases are left out."""
    ended = time.time()
    if outcome.book_error:
        summary["wall_s"] = max(0.0, ended - ctx.started)
        summary["goodput"] = {"wall_s": summary["wall_s"], "unknown": outcome.book_error}
        summary["startup"], summary["teardown"] = {}, {}
        return
    parts = wall_parts(ctx.started, ended, outcome.book, outcome.ended)
    run = summary.get("goodput_run") or {}
    book = outcome.book or {}
    base = book.get("driver_base") or {}
    for key in ("restarts", "recomputed_steps"):  # this driver's; the run's are in goodput_run
        parts[key] = max(0, int(run.get(key, 0)) - int(base.get(key, run.get(key, 0))))
    summary["wall_s"] = parts["wall_s"]
    summary["goodput"] = parts
    summary["startup"] = startup_phases(ctx, outcome, parts)
    summary["teardown"] = teardown_phases(ctx, outcome, parts, ended)


def _timeline_for(ctx: RunContext) -> timeline.Timeline | None:
    tl = timeline.current()
    return tl if tl is not None and tl.launched == ctx.started else None


def startup_phases(ctx: RunContext, outcome: Outcome, parts: dict[str, float]) -> dict[str, float]:
    """Launch to the training loop's start, by phase (they add up to ``goodput.startup_s``)."""
    tl, loop = _timeline_for(ctx), (outcome.book or {}).get("loop_started_unix")
    if tl is None:
        return {"launch -> training loop": parts["startup_s"]}
    out = dict(tl.phases(until="trainer start" if loop else None))
    if loop and tl.at("trainer start") is not None:
        out["workers start -> training loop"] = max(0.0, loop - tl.at("trainer start"))
    return {k: v for k, v in out.items() if k not in ("fit",)} if loop else _before_teardown(out)


def _before_teardown(phases: dict[str, float]) -> dict[str, float]:
    """Nothing trained: the phases up to training's end are all startup."""
    out: dict[str, float] = {}
    for name, secs in phases.items():
        out[name] = secs
        if name in ("fit", "checkpoint check"):
            break
    return out


def teardown_phases(ctx: RunContext, outcome: Outcome, parts: dict[str, float], ended: float) -> dict[str, float]:
    """Training's last sign of life to now, by phase (they add up to ``goodput.teardown_s``)."""
    book, tl = outcome.book or {}, _timeline_for(ctx)
    out: dict[str, float] = {}
    last = book.get("last_time") if book.get("loop_started_unix") else None
    if outcome.ended is None:
        return {"teardown": parts["teardown_s"]}
    since = next((n for n in ("fit", "checkpoint check") if tl is not None and tl.at(n) is not None), None)
    # the driver's own phases start at its mark ``since`` when it has one, else when the workers' outcome came:
    # "workers stop" ends there, so that the parts add up to the teardown (a gap between the two was lost)
    stopped = tl.at(since) if tl is not None and since is not None else outcome.ended
    if last is not None:
        if book.get("finalize_s"):  # as goodput.wall_parts counts it: at most the loop's own span
            out["final summary + tracking flush"] = max(0.0, parts["teardown_s"] - max(0.0, ended - last))
        out["workers stop"] = max(0.0, stopped - last)
    if tl is not None and since is not None:
        out.update(tl.phases(since=since))
        out["summary"] = max(0.0, ended - tl.last)
    else:
        out["final model + tracking"] = max(0.0, ended - outcome.ended)
    return out


def finish(ctx: RunContext, outcome: Outcome, summary: dict[str, Any], log_model: bool = True) -> None:
    """Final model (FINISHED runs; ``log_model=False`` for sweep trials), summary metrics, terminal status."""
    spec = ctx.tracking
    if spec is None:
        return
    backend = backend_for(spec, ctx.home)
    if log_model and outcome.status == "FINISHED" and summary.get("checkpoint") and not outcome.already_complete:
        try:
            summary.update(log_checkpoint_model(ctx, spec, summary["checkpoint"]))
        except Exception as e:  # the run trained; a model upload failure is reported, not fatal
            summary["model_error"] = f"{type(e).__name__}: {e}"
        if ctx.bundle is not None and ctx.bundle.info.get("tokenizer_file"):  # token shards: tokenizer + samples
            try:
                from elastic_train.launch.generation import log_samples

                summary.update(log_samples(ctx, spec, summary["checkpoint"]))
            except Exception as e:  # as for the model: reported, not fatal
                summary["samples_error"] = f"{type(e).__name__}: {e}"
    account(ctx, outcome, summary)  # the model upload is teardown: count it (the flush below is not in MLflow's copy)
    close_run(backend, spec, summary, outcome.status)
    timeline.mark("final model + tracking")
    account(ctx, outcome, summary)


def close_run(backend: Any, spec: TrackingSpec, summary: dict[str, Any], status: str) -> None:
    """The summary's final metrics, world sizes, goodput and restarts into the run, then its terminal status
    (the driver of ``jobs.train``; a sweep's driver for each trial, from the summary the trial wrote)."""
    writer = backend.writer(spec)
    final = {f"final_{k}": v for k, v in summary["final_metrics"].items() if isinstance(v, int | float)}
    step = summary.get("steps") or 0
    goodput = {f"goodput_{k}": v for k, v in (summary.get("goodput") or {}).items() if isinstance(v, int | float)}
    writer.log_metrics({**final, "restarts": summary["restarts"], **goodput}, step=step)
    writer.set_tags({"world_sizes": summary["world_sizes"], "status_detail": summary.get("error", "ok")})
    leftover = writer.close(timeout_s=60)
    if leftover["unsent"]:
        summary["tracking_unsent"] = summary.get("tracking_unsent", 0) + leftover["unsent"]
        summary["tracking_spool"] = leftover["spool_path"]
    try:
        backend.end_run(spec, status)
    except Exception as e:
        summary["tracking_error"] = f"could not set the run status: {e}"


def log_checkpoint_model(ctx: RunContext, spec: TrackingSpec, checkpoint_uri: str) -> dict[str, Any]:
    """Log the model a checkpoint holds as ``spec``'s run model (with its config, to rebuild an evaluation)."""
    from ray.train import Checkpoint

    from elastic_train.train.state import load_model

    with Checkpoint(checkpoint_uri).as_directory() as d:
        model, cfg, meta = load_model(d)
        example = as_numpy_example(ctx.bundle) if ctx.bundle is not None else None
        metadata = {"elastic_train": {"config": cfg.model_dump(mode="json"), "data_spec": meta["data_spec"],
                                      "checkpoint": checkpoint_uri, "run_name": ctx.run_name}}
        tokenizer = Path(d) / TOKENIZER  # token shards: the model carries its tokenizer (jobs.generate --model)
        extra = [str(tokenizer)] if tokenizer.is_file() else None
        return backend_for(spec, ctx.home).log_model(spec, model, example, ctx.cfg.tracking.register_model,
                                                     metadata, extra)


# ---------------------------------------------------------------------------------------- output


def render_summary(summary: dict[str, Any]) -> str:
    fm = summary["final_metrics"]
    rows = [
        ("run", summary["run_name"]),
        ("status", summary["status"]),
        *[(k, _fmt(v)) for k, v in fm.items()],
        ("steps / epochs",
         f"{'-' if summary['steps'] is None else summary['steps']} / "
         f"{_fmt(summary.get('epochs_run', summary['epochs']), 'g')}"),
        ("world sizes", " -> ".join(map(str, summary["world_sizes"])) or "-"),
        ("restarts", summary["restarts"]),
        ("samples/s (steady)", _fmt(summary["samples_per_second"], ",.0f")),
        ("time to first step", _fmt(summary["time_to_first_step_s"], ".1f", " s")),
        ("wall", _fmt(summary["wall_s"], ".1f", " s")),
        ("goodput", _goodput_text(summary.get("goodput") or {})),
        ("startup", _phases_text(summary.get("startup") or {})),
        ("teardown", _phases_text(summary.get("teardown") or {})),
        ("checkpoint", summary["checkpoint"] or "-"),
        ("behind storage", _behind_text(summary.get("behind_storage"))),
        (
            "tracking run",
            f"{summary['mlflow_run_id']} @ {summary['tracking_uri']}" if summary["mlflow_run_id"] else "off",
        ),
        ("params sha256", (summary["params_sha256"] or "-")[:16]),
    ]
    if summary.get("mfu") is not None:
        rows.append(("MFU", _fmt(summary["mfu"], ".1%")))
    if summary.get("tracking_unsent"):
        rows.append(("unsent metrics", f"{summary['tracking_unsent']} in {summary['tracking_spool']}"))
    if summary.get("checkpoint_copies_unsent"):
        rows.append(("unsent checkpoint copies", f"{summary['checkpoint_copies_unsent']} (see the warnings above; "
                                                 "the checkpoints themselves are in storage)"))
    if summary.get("error"):
        rows.append(("error", summary["error"]))
    width = max(len(k) for k, _ in rows)
    return "\n".join(["=" * 72, *(f"{k:<{width}}  {v}" for k, v in rows), "=" * 72])


def _goodput_text(g: dict[str, Any]) -> str:
    """``71.2% productive of 52.0 s: startup 12.1, checkpoint 0.4, eval 0.2, ...`` (non-zero parts only)."""
    if not g:
        return "-"
    if "unknown" in g:
        return f"unknown ({g['unknown']}; the run's log says why)"
    names = {"startup_s": "startup", "productive_s": "steps", "checkpoint_s": "checkpoint", "eval_s": "eval",
             "restart_lost_s": "restart lost", "teardown_s": "teardown", "other_s": "other"}
    parts = ", ".join(f"{label} {g[k]:.1f}" for k, label in names.items() if g.get(k, 0) >= 0.05)
    return f"{g.get('goodput_ratio', 0):.1%} of {g.get('wall_s', 0):.1f} s wall ({parts} s)"


def _behind_text(b: dict[str, Any] | None) -> str:
    """``at worst 4 steps / 1.3 s ahead of the newest durable checkpoint; 11 uploads, 0.45 s each``."""
    if not b:
        return "-"
    return (f"at worst {b['worst_steps']} steps / {b['worst_s']:.1f} s ahead of the newest durable checkpoint; "
            f"{b['uploads']} uploads, {b['upload_s_mean']:.2f} s each until durable")


def _phases_text(phases: dict[str, float]) -> str:
    shown = [(k, v) for k, v in phases.items() if v >= 0.05]
    return ", ".join(f"{k} {v:.1f}" for k, v in shown) + " s" if shown else "-"


def _fmt(v: Any, spec: str = ".4f", unit: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:{spec}}{unit}" if isinstance(v, int | float) else str(v)
