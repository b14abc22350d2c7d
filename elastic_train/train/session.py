"""One worker's life between (re)start and finish: build, restore, announce, the step loop, checkpoints.

Read top-down. :class:`Session` builds this rank's data and the model through the strategy, with the
TrainState around them; :meth:`~Session.start` restores the checkpoint (or seeds a fresh start, or continues a
PBT donor's) and announces the (re)start; :meth:`~Session.run` is the loop: a step, a sync point where every rank
all-reduces rank 0's flags (with the metrics window, logged, at a log point), a checkpoint when the policy has a
reason. Goodput, test faults and restart markers are :class:`~elastic_train.train.hooks.LoopHooks` called at
named moments; the loop does not know what they do. Written for restarts (DESIGN invariants 1-4): the BatchPlan
comes from the *current* world size, the data position from the restored progress.

No Ray and no MLflow here: worker.py hands in the rank, the device, Ray Train's report and preemption calls
and the ledger as a :class:`Host` of plain values and callables.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import worker_data
from elastic_train.data.spec import eval_batch_size
from elastic_train.models import build_model
from elastic_train.train import interval
from elastic_train.train import metrics as metric_math
from elastic_train.train.budget import Budget
from elastic_train.train.console import Console
from elastic_train.train.evaluator import validate
from elastic_train.train.faults import FaultHook
from elastic_train.train.goodput import GoodputReporter
from elastic_train.train.hooks import LoopHooks
from elastic_train.train.loop import Batch, loss_function, make_optimizer, make_scheduler, train_step
from elastic_train.train.policy import CheckpointPolicy
from elastic_train.train.state import (
    RECENT_METRICS,
    RunRecord,
    TrainState,
    checkpoint_dir_name,
    params_sha256,
    schedule_entry,
    seed_everything,
)
from elastic_train.train.strategy import make_strategy
from elastic_train.train.uploads import Uploads
from tracking import NullTracker, Tracker

if TYPE_CHECKING:  # pydantic-free at run time
    from elastic_train.config import JobConfig
    from elastic_train.data import DataBundle


@dataclass
class Host:
    """What a session gets from outside: where it runs and how it talks to the driver and to Ray Train."""

    rank: int
    world: int
    device: torch.device
    console: Console
    tracker: Tracker  # rank 0's; a no-op elsewhere
    goodput: GoodputReporter
    fault: FaultHook
    report: Callable[[dict[str, Any], str, str], None]  # (metrics, checkpoint folder, its fixed name)
    # None, or the preempted node ids and a deadline (a barrier); the callable itself None: nothing watches (no barrier)
    preemption_info: Callable[[], Any] | None
    ray_train_run_id: str | None = None  # into meta.json: a resumed driver releases this run's reservation
    attempt: int | None = None  # this worker group's attempt (train/fence.py): into meta.json
    keep_spares: Callable[[], None] | None = None  # start keeping the node's warm spares (train/spares.py)
    uploads: Uploads | None = None  # this rank's checkpoint uploads: one in flight (train/uploads.py)


class Session:
    """One worker's life between (re)start and finish."""

    def __init__(self, cfg: JobConfig, host: Host, bundle: DataBundle, *, config: dict[str, Any],
                 record: RunRecord, log_floor: int):
        self.cfg, self.host, self.bundle = cfg, host, bundle
        self.config = config  # as the driver sent it: it goes into every checkpoint's meta.json
        self.log_floor = log_floor  # metrics at steps <= this were logged by an earlier driver
        self.rank, self.world, self.device = host.rank, host.world, host.device
        self.console, self.tracker = host.console, host.tracker
        self.hooks = LoopHooks(host.goodput, host.fault, host.device, host.keep_spares)
        self.strategy = make_strategy(cfg.scaling.strategy)
        self.throughput = metric_math.Throughput()
        self.interval_choice: interval.Choice | None = None  # checkpoint.every_steps=auto, rank 0's last
        self._build(record)
        self.window = metric_math.Window(self.device)  # the steps since the last log point
        self.policy = CheckpointPolicy(cfg, host.preemption_info, self.console.line, self.budget)
        self.hooks.built()

    def _build(self, record: RunRecord) -> None:
        cfg = self.cfg
        self.plan = BatchPlan(cfg.train.global_batch_size, self.world, cfg.train.micro_batch_size)
        self.data = worker_data(
            self.bundle, self.plan, self.rank, cfg.seed, self.device, cfg.data.loader_workers, cfg.data.trace_path
        )
        model = build_model(cfg, self.bundle.spec)
        if cfg.train.compile:
            model.compile()  # in place: state_dict keys stay clean
        self.loss_fn = loss_function(cfg.train.compile)
        self.model = self.strategy.prepare(model, cfg, self.device)
        self.precision = self.strategy.precision(cfg.train.precision, self.device)
        optimizer = make_optimizer(self.model, cfg.train)
        self.budget = Budget.of(cfg.train, self.data.steps_per_epoch, self.bundle.spec.tokens_per_sample)
        scheduler = make_scheduler(optimizer, cfg.train, self.budget.total_steps)
        self.state = TrainState(self.model, optimizer, scheduler, self.precision, self.strategy, record=record)
        self.flops_per_sample = metric_math.flops_per_sample(self.model, self.bundle.spec, cfg)

    def start(self, directory: str | None, checkpoint_name: str | None = None,
              adopt_as: RunRecord | None = None) -> None:
        """Resume from the checkpoint in ``directory`` (``checkpoint_name``: its name, for the console), or start
        afresh (None), or, with ``adopt_as``, continue another run's checkpoint as this run (a PBT clone: its
        accounting starts afresh at the donor's position); then announce the attempt."""
        resumed = self._restore(directory)
        if adopt_as is not None:
            self._adopt(adopt_as)
            resumed = False
        self._begin_attempt(checkpoint_name if resumed else None, resumed)

    def _restore(self, directory: str | None) -> bool:
        """Load the checkpoint in ``directory`` (True); None: a fresh start, seeded per rank (False)."""
        if directory is None:
            seed_everything(self.cfg.seed * 1000 + self.rank)
            t = self.cfg.train
            self.state.record.schedule = [schedule_entry(0, t.lr, t.global_batch_size, self.state.record.run_name)]
            return False
        same_rng = self.state.load(directory, self.rank, map_location=self.device)
        self.data.restore(self.state.data_position)  # a streamed source: the ids this epoch already consumed
        if not same_rng:  # a new world size: derive this rank's RNG from the position, deterministically
            seed_everything(self.cfg.seed * 1000 + self.rank + 7919 * self.state.progress.global_step)
        self.hooks.restored(self.state.progress.global_step)
        return True

    def _adopt(self, record: RunRecord) -> dict[str, Any]:
        """After :meth:`_restore` from another run's checkpoint (a PBT clone): continue its state as this run,
        with this run's learning rate."""
        origin = self.state.adopt(self.cfg.train.lr, record, self.cfg.train.global_batch_size)
        t = self.cfg.train
        self.console.line(f"cloned from {origin['run_name']} at step {origin['global_step']} (epoch "
                          f"{origin['epoch']}): lr {t.lr:.4g}, global batch {t.global_batch_size}")
        self.data.mark({"cloned_from": origin})
        self.tracker.set_tags({"pbt.cloned_from": origin["run_name"], "pbt.cloned_at_step": origin["global_step"],
                               "pbt.cloned_at_epoch": origin["epoch"]})
        return origin

    def _begin_attempt(self, checkpoint_name: str | None, resumed: bool) -> None:
        """Charge the goodput book for this (re)start and announce it: console lines, tags, metrics."""
        p, rec = self.state.progress, self.state.record
        event = self.hooks.attempt_begun(
            self.world,
            p.global_step if resumed else None,
            rec.goodput if resumed else None,
            rec.world_sizes,
        )
        book = self.hooks.book
        # Step metrics are logged only after the last step MLflow holds (recomputed steps once, lost ones again).
        self.tracker.skip_logged_steps(max(self.log_floor, book.tracking_floor))
        if resumed:  # what the last attempt logged up to its checkpoint, in case its sender never sent it
            for step, metrics in self.state.record.recent_metrics:
                self.tracker.log_metrics(metrics, step=step, unless_logged=True)
        where = self.device.type if self.device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads each"
        self.console.line(f"worker group of {self.world} ({where}): {self.plan}")
        if event["restart"]:
            where = (
                f"{checkpoint_name} (epoch {p.epoch + 1}, step {p.step_in_epoch})" if checkpoint_name else "the start"
            )
            resize = (
                f", resized {event['previous_world_size']} -> {self.world} workers"
                if event["previous_world_size"]
                else ""
            )
            self.console.line(
                f"restart {event['restarts']}: resumed from {where}{resize}; "
                f"recomputing {event['recomputed_steps']} step(s)"
            )
            self.tracker.set_tags({"restarts": event["restarts"], "world_sizes": book.world_sizes})
        self.tracker.set_tags({"world_size": self.world, "batch_plan": str(self.plan)})
        self.tracker.log_metrics(
            {"world_size": self.world, "restarts": book.totals.restarts, "accum_steps": self.plan.accum_steps},
            step=p.global_step,
        )
        self.hooks.announced()

    # ------------------------------------------------------------------------------ the loop
    def run(self) -> None:
        cfg, p, steps_per_epoch = self.cfg, self.state.progress, self.data.steps_per_epoch
        self.hooks.loop_started()
        if self.host.uploads is not None:  # how far training runs ahead of storage counts from the restored step
            self.host.uploads.start(lambda: self.state.progress.global_step, p.global_step)
        self.window.reset()
        self.policy.start_clocks()
        self._retune()  # a restart or a resumed job decides from what the run has learned
        first = True
        while not self.budget.done(p):
            self.console.epoch_bar(p.epoch, self.budget.epochs, steps_per_epoch, p.step_in_epoch)
            then = p.epoch + 1 if p.epoch + 1 < self.budget.epochs else None  # a stream starts it early
            for micro in self._timed(self.data.epoch(p.epoch, p.step_in_epoch, then)):
                at = (p.global_step + 1, (p.step_in_epoch + 1) % steps_per_epoch)
                log = self.policy.is_log_point(*at)
                sync = log or self.policy.is_sync_point(*at)
                result = train_step(
                    self.model, micro, self.state.optimizer, self.state.scheduler, self.precision,
                    self.plan.loss_scale, cfg.train.grad_clip, measure_grad_norm=log, loss_fn=self.loss_fn,
                )
                p.advance(cfg.train.global_batch_size, steps_per_epoch)
                self.window.add(result)
                self.hooks.stepped(p.global_step, first)
                first = False
                if sync:
                    self._maybe_checkpoint(self._sync(log), epoch_end=p.step_in_epoch == 0, logged=log)
                if self.budget.done(p):  # a step/token budget ends mid-epoch (its last step was a sync point)
                    break
        if not self.window.empty:  # the loop ended between sync points
            self._maybe_checkpoint(self._sync_and_log(), epoch_end=True)

    def _timed(self, steps: Iterator[tuple[int, list[Batch]]]) -> Iterator[list[Batch]]:
        """The epoch's micro-batch lists, the wait for each counted as the window's data wait."""
        while True:
            t0 = time.perf_counter()
            item = next(steps, None)
            self.window.data_wait_s += time.perf_counter() - t0
            if item is None:
                return
            yield item[1]

    def _sync(self, log: bool) -> dict[str, Any]:
        """A sync point: rank 0's flags on every rank, with the metrics window (logged) at a log point."""
        if log:
            return self._sync_and_log()
        flags = self.window.reduce_flags(self.rank, self.policy.flags())
        self.policy.synced(flags)
        return flags

    def _sync_and_log(self) -> dict[str, bool]:
        """All-reduce the window's sums (plus rank 0's control flags); log them; return the flags."""
        totals, flags = self.window.reduce(self.rank, self.policy.flags())
        p = self.state.progress
        self.state.record_epoch(totals)
        ended = time.perf_counter()
        wall = ended - self.window.t0
        stats = metric_math.interval_metrics(totals, wall, self.window.data_wait_s, self.bundle.spec,
                                             self.flops_per_sample, self.device, self.cfg)
        stats["lr"] = self.state.scheduler.get_last_lr()[0]
        stats["epoch"] = p.epoch + (p.step_in_epoch / self.data.steps_per_epoch)
        self._log(stats, p.global_step)
        self.console.progress(
            int(totals["steps"]),
            f"{self.budget.label(p)} loss {stats['train_loss']:.4f} {metric_math.speed_text(stats)}",
        )
        self.throughput.add(totals["samples"], wall, warm=self.window.warm, data_wait_s=self.window.data_wait_s)
        self.hooks.window_logged(p.global_step, wall)
        self.window.reset(since=ended)  # this logging is charged to the next window: the rates stay honest
        self.policy.synced(flags)
        return flags

    def _maybe_checkpoint(self, flags: dict[str, bool], epoch_end: bool, logged: bool = True) -> None:
        reason = self.policy.reason(flags, self.state.progress, epoch_end)
        if reason is not None:
            if not logged:  # a clock-based checkpoint between log points: the window is logged first (every
                self._sync_and_log()  # rank: the flags that decided it are every rank's), the epoch's sums stay whole
            self.checkpoint(reason)

    # ------------------------------------------------------------------------------ checkpoints
    def checkpoint(self, reason: str) -> dict[str, Any]:
        """Validate and log, save every rank's part, and report (the upload is asynchronous). A ``final``
        checkpoint also closes tracking and carries the run's summary."""
        t0 = time.perf_counter()
        p, book = self.state.progress, self.hooks.book
        metrics, eval_s = self._validate_and_log(reason)
        finalize_s = 0.0
        self._uploads_measured()
        if reason == "final":
            t1 = time.perf_counter()
            metrics.update(self._close_tracking_and_summarise())
            finalize_s = time.perf_counter() - t1  # goodput: teardown (tracking flush, final hashes)
        self.state.record.goodput = book.totals
        self.state.record.world_sizes = list(book.world_sizes)
        self.state.data_position = self.data.position(p.epoch, p.step_in_epoch)  # a collective when streamed
        directory = tempfile.mkdtemp(prefix="elastic-train-ckpt-")
        tokenizer = self.bundle.info.get("tokenizer_file")
        if tokenizer and self.rank == 0:  # token shards: the checkpoint carries its tokenizer (jobs.generate)
            shutil.copyfile(tokenizer, os.path.join(directory, os.path.basename(tokenizer)))
        self.state.save(directory, self.rank, meta={"metrics": metrics, "config": self.config,
                                                    "data_spec": asdict(self.bundle.spec),
                                                    "batch_plan": self.plan.describe(), "reason": reason,
                                                    "ray_train_run_id": self.host.ray_train_run_id,
                                                    "attempt": self.host.attempt})
        self.hooks.checkpoint_written(p.global_step)
        self.host.report(metrics, directory, checkpoint_dir_name(p))
        self.hooks.checkpointed(p.global_step, time.perf_counter() - t0, eval_s, finalize_s)
        self._retune()
        self.hooks.flush()
        self.policy.checkpointed()
        self.window.reset()
        return metrics

    def _uploads_measured(self) -> None:
        """Fold what this rank's uploads measured (train/uploads.py) into the goodput book."""
        if self.host.uploads is not None:
            d = self.host.uploads.take()
            self.hooks.uploads_measured(d.upload_s, d.uploads, d.worst_behind_steps, d.worst_behind_s)

    def finish_uploads(self) -> None:
        """After the loop: wait (bounded) for the last upload, the final checkpoint's, and book what it took, so
        the run's book holds every upload and the worst lag behind storage. Not after a failure (nothing waits)."""
        if self.host.uploads is not None:
            self.host.uploads.drain()
            self._uploads_measured()
            self.hooks.flush()

    def _retune(self) -> None:
        """``checkpoint.every_steps=auto``: rank 0 decides again from the run's goodput totals (train/interval.py)
        and proposes the interval to every rank; a change goes to the console (one line) and the tracker."""
        c = self.cfg.checkpoint
        if c.every_steps != "auto" or self.rank != 0:
            return
        t, step = self.hooks.book.totals, self.state.progress.global_step
        choice = interval.choose_from_totals(t, step, self.cfg.failure.mtbf_s, self.world, c.min_every_steps)
        if choice is None:
            return
        self.interval_choice = choice
        self.policy.propose(choice.every_steps)
        if choice.every_steps != t.auto_every_steps:
            t.auto_every_steps, t.interval_changes = choice.every_steps, t.interval_changes + 1
            self.console.line(choice.line())
            self.tracker.log_metrics({"checkpoint_auto_every_steps": choice.every_steps,
                                      "checkpoint_auto_interval_s": choice.interval_s,
                                      "checkpoint_auto_cost_s": choice.checkpoint_cost_s,
                                      "checkpoint_auto_upload_s": choice.upload_s,
                                      "checkpoint_auto_mtbf_s": choice.mtbf_s}, step=step)

    def _validate_and_log(self, reason: str) -> tuple[dict[str, Any], float]:
        """Validation, progress and train metrics, logged (with the goodput totals) and printed in one line;
        with the seconds validation took."""
        p, book = self.state.progress, self.hooks.book
        t0 = time.perf_counter()
        batch = eval_batch_size(self.bundle.spec, self.plan.micro_batch_size)
        batches = self.data.val_batches(batch, equal_counts=self.strategy.equal_eval_batches)
        metrics, _ = validate(self.model, batches, self.precision, self.device, self.world, self.bundle.spec)
        eval_s = time.perf_counter() - t0
        metrics.update({"epoch": p.epoch, "global_step": p.global_step, "samples_seen": p.samples_seen,
                        "world_size": self.world, "restarts": book.totals.restarts, "reason": reason})
        metrics.update(self.state.epoch_metrics(self.bundle.spec.tokens_per_sample))
        # The book's goodput at each checkpoint but the final one: at the final step the driver logs the run's
        # goodput under the same names (its wall in parts: launch/summary.py close_run, docs/mlflow.md). Both there
        # gave every goodput_* metric two different values at one step (tests/distributed/test_sweep_metrics.py).
        goodput = {} if reason == "final" else {f"goodput_{k}": v for k, v in book.totals.summary().items()}
        self._log({**{k: v for k, v in metrics.items() if k.startswith("val_")}, **goodput}, p.global_step,
                  always=reason == "final")
        self.console.close()
        self.console.line(
            f"{self.budget.label(p)}: "
            + " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith(("val_", "train_loss")))
            + f" [checkpoint: {reason}]"
        )
        return metrics, eval_s

    def _close_tracking_and_summarise(self) -> dict[str, Any]:
        """The final checkpoint: flush and close tracking (a no-op tracker from here on) and return the run's
        summary (final hashes, speed, goodput, world sizes, what tracking could not send)."""
        sd = self.state.model_state_dict()  # collective for sharded models: every rank calls it
        unsent = self.tracker.close(timeout_s=60)
        self.tracker = NullTracker()
        book = self.hooks.book
        return {
            "params_sha256": params_sha256(sd) if self.rank == 0 else "",
            "samples_per_second": self.throughput.rate(),
            "samples_per_second_median": self.throughput.median_rate(),
            "first_step_unix": book.first_step_unix,
            "goodput": book.totals.summary(),
            "world_sizes": list(book.world_sizes),
            "tracking_unsent": unsent.get("unsent", 0),
            "tracking_spool": unsent.get("spool_path"),
            "steps_per_epoch": self.data.steps_per_epoch,
            "checkpoint_interval": ({**self.interval_choice.as_dict(), "changes": book.totals.interval_changes}
                                    if self.interval_choice else None),
            **metric_math.perf_summary(self.throughput, self.bundle.spec, self.flops_per_sample, self.device,
                                       self.cfg),
        }

    def _log(self, metrics: dict[str, Any], step: int, always: bool = False) -> None:
        """Log step metrics; unless ``always``, the tracker skips steps the run already holds. Step metrics are
        also kept in the run record (the checkpoint carries the last ones: :meth:`_begin_attempt` logs them again)."""
        self.tracker.log_metrics(metrics, step=step, unless_logged=not always)
        if not always and self.rank == 0:
            recent = self.state.record.recent_metrics
            recent.append([step, {k: v for k, v in metrics.items() if isinstance(v, (int, float))}])
            del recent[:-RECENT_METRICS]
        self.hooks.metrics_logged(step)

    def close(self) -> None:
        self.hooks.close()
        self.console.close()
        self.data.close()
        self.tracker.close(timeout_s=10)
