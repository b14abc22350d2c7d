"""``fit(ctx)``: the one way a run trains (``jobs.train`` and every sweep trial call it; DESIGN invariant 6)."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from elastic_train import runlog
from elastic_train.compat import features
from elastic_train.data import DataBundle, TensorSet
from elastic_train.data.spec import StreamSplit
from elastic_train.launch import timeline
from elastic_train.launch.context import RunContext, local_run_folder
from elastic_train.train.ledger import RunLedger
from elastic_train.train.resources import RunResources
from tracking import backend_for


@dataclass(frozen=True)
class Outcome:
    """How ``fit`` ended. Failures are an outcome, not an exception: the summary and run status still follow."""

    result: Any | None  # Ray Train's Result
    error: BaseException | None
    book: dict[str, Any] | None  # the goodput book from the run's ledger
    status: str  # FINISHED | FAILED | KILLED
    already_complete: dict[str, Any] | None = None  # {"checkpoint", "meta"}: nothing was left to train
    ended: float | None = None  # unix time training returned (teardown follows)
    book_error: str | None = None  # the ledger could not be read: the summary's goodput is "unknown" (why)
    tracking_copies: dict[str, Any] | None = None  # checkpoint copies into the tracking run: {"sent", "unsent"}


def fit(ctx: RunContext, resources: RunResources | None = None) -> Outcome:
    """Run the trainer for ``ctx`` (``connect``-ed, and ``track``-ed when tracking is on). ``resources``: what the
    caller hands the run besides its config (train/resources.py; a sweep trial's shared actors, its PBT donor, its
    scaling policy); this fit completes them: the dataset is put in the object store unless ``data_ref`` is set, the
    fit gets a ledger of its own (train/ledger.py), the log floor of a resumed run is read, and the run's tracking
    callbacks join the caller's."""
    from elastic_train.launch.reservations import release_dead_runs_requests, release_stale_reservation
    from elastic_train.launch.trainer import build_trainer, run_store

    folder = str(local_run_folder(ctx))
    runlog.attach(folder)  # what this run lets go, once each (elastic_train/runlog.py)
    latest = ctx.storage.latest_checkpoint()
    if latest and _budget_spent(ctx, latest[1].get("progress", {})):
        timeline.mark("checkpoint check")
        return Outcome(None, None, None, "FINISHED", already_complete={"checkpoint": latest[0], "meta": latest[1]},
                       ended=time.time())
    ctx.storage.save_config(ctx.cfg.model_dump(mode="json"))
    res = resources or RunResources()
    log_floor = (
        backend_for(ctx.tracking, ctx.home).last_logged_step(ctx.tracking) if ctx.tracking and ctx.resuming else -1
    )
    if ctx.cfg.scaling.elastic and features.enabled("dead_run_requests"):  # only elastic runs reserve workers
        if latest:  # a killed driver's Train run keeps the workers' resources reserved for 180 s otherwise
            release_stale_reservation(latest[1].get("ray_train_run_id"))
        release_dead_runs_requests()  # and any other dead controller's (a driver killed before its first checkpoint)
    ledger = RunLedger(uuid.uuid4().hex, run_store(ctx))  # a fresh key: no earlier life's book is ours
    res = replace(res, ledger=ledger, log_floor=log_floor, run_folder=folder,
                  data_ref=res.data_ref if res.data_ref is not None else share_data(ctx.bundle))
    trainer = build_trainer(ctx, res)
    timeline.mark("trainer start")
    with _checkpoint_copies(ctx) as copies:
        result, error, status = _run(trainer)
        ended = time.time()
    timeline.mark("fit")
    book, book_error = read_ledger(ledger)
    return Outcome(result, error, book, status, ended=ended, book_error=book_error, tracking_copies=copies.tally)


def read_ledger(ledger: RunLedger) -> tuple[dict[str, Any] | None, str | None]:
    """The fit's goodput book and why it could not be read (the summary then says its goodput is unknown: the wall
    cannot be split without it); then the fit's entries are deleted. What is lost is written to the run's log,
    once."""
    book = book_error = None
    try:
        book = ledger.get()
    except Exception as e:
        book_error = f"the goodput book could not be read ({type(e).__name__})"
        runlog.dropped("the goodput book: the summary's goodput is unknown", e)
    try:
        ledger.drop()
    except Exception as e:
        runlog.dropped(f"deleting this fit's ledger entries ({ledger.key}/)", e)
    return book, book_error


def _budget_spent(ctx: RunContext, progress: dict[str, Any]) -> bool:
    """The stored progress already reached the run's budget (epochs, or max_steps / max_tokens)."""
    from elastic_train.data.sampler import steps_per_epoch
    from elastic_train.train.budget import Budget
    from elastic_train.train.state import Progress

    t = ctx.cfg.train
    if t.max_steps is None and t.max_tokens is None or ctx.bundle is None:
        return progress.get("epoch", 0) >= t.epochs
    spe = steps_per_epoch(len(ctx.bundle.train), t.global_batch_size)
    budget = Budget.of(t, spe, ctx.bundle.spec.tokens_per_sample)
    return budget.done(Progress(**{k: progress.get(k, 0) for k in ("epoch", "step_in_epoch", "global_step",
                                                                   "samples_seen")}))


class _NoCopies:
    tally: dict[str, Any] | None = None

    def __enter__(self) -> _NoCopies:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _checkpoint_copies(ctx: RunContext) -> Any:
    """The run's checkpoints copied into its tracking run while it trains (launch/copies.py), when the run is
    tracked and asks for checkpoints and its backend keeps them; else nothing."""
    spec, t, c = ctx.tracking, ctx.cfg.tracking, ctx.cfg.checkpoint
    if spec is None or t.log_checkpoints == ["none"]:
        return _NoCopies()
    copier = backend_for(spec, ctx.home).checkpoint_copier(spec, t.log_checkpoints, c.score, c.score_mode)
    if copier is None:
        return _NoCopies()
    from elastic_train.launch.copies import CheckpointWatch
    from elastic_train.launch.trainer import run_store

    return CheckpointWatch(copier, run_store(ctx))


def _run(trainer: Any) -> tuple[Any | None, BaseException | None, str]:
    """``trainer.fit()`` with failures and Ctrl-C turned into a status."""
    result = error = None
    status = "FINISHED"
    # Ray Train's fit() installs a SIGINT handler holding the controller's handle and leaves it installed:
    # an in-process caller (a notebook, a test session) would keep that controller, and what it holds,
    # alive until the next fit. Put the caller's handler back.
    sigint = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
    try:
        result = trainer.fit()
    except KeyboardInterrupt as e:
        error, status = e, "KILLED"
    except Exception as e:  # TrainingFailedError and friends: report, don't crash
        error, status = e, "FAILED"
    finally:
        if sigint is not None:
            signal.signal(signal.SIGINT, sigint)
    if result is not None and getattr(result, "error", None) is not None:
        error, status = result.error, "FAILED"
    return result, error, status


def share_data(bundle: DataBundle | None) -> Any | None:
    """Put the driver's dataset in the object store so workers skip rebuilding it (None if it won't pickle)."""
    import ray

    shareable = (TensorSet, StreamSplit)  # rows in memory, or a stream's small reading instructions
    if bundle is None or not (isinstance(bundle.train, shareable) and isinstance(bundle.val, shareable)):
        return None
    return ray.put(bundle)
