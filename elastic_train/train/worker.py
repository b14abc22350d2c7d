"""``train_loop_per_worker``: restore -> build -> loop -> report. The only module that calls Ray Train.

Written for restarts (DESIGN invariants 1-4): the first act is ``ray.train.get_checkpoint()``; the BatchPlan is
derived from the *current* world size; the data position comes from the restored progress; ``report`` happens
only at checkpoint cadence, with asynchronous upload. Loss and accuracy are sums all-reduced over every
worker. Rank 0 logs to MLflow through a tracker that is a no-op on the other ranks.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointUploadMode

from elastic_train.config import JobConfig
from elastic_train.data import build_data
from elastic_train.data.batching import BatchPlan
from elastic_train.data.loader import WorkerData
from elastic_train.models import build_model
from elastic_train.train import metrics as metric_math
from elastic_train.train.goodput import GoodputBook
from elastic_train.train.loop import (
    Precision,
    evaluate,
    loss_function,
    make_optimizer,
    make_scheduler,
    train_step,
)
from elastic_train.train.state import TrainState, checkpoint_dir_name, params_sha256, seed_everything
from tracking import Tracker, TrackingSpec, tracker_for

FAULT_ENV = "ELASTIC_TRAIN_FAULT"  # test hook, e.g. "step=7,rank=1,marker=/tmp/f,mode=exit" (see fault_hook)
PREEMPTION_CHECK_S = 2.0


@dataclass
class WorkerArgs:
    """What the driver hands every worker (through ``train_loop_config``)."""

    config: dict[str, Any]
    run_name: str
    tracking: TrackingSpec | None = None
    ledger: Any | None = None
    log_floor: int = -1  # metrics at steps <= this were logged by an earlier driver; skip them
    fault: str | None = None
    progress_bars: bool = False  # tqdm_ray bars when the driver writes to a terminal, else plain lines
    data_ref: Any | None = None  # the driver's DataBundle in the object store (skips rebuilding it)


def train_loop_per_worker(args: dict[str, Any]) -> None:
    checkpoint = ray.train.get_checkpoint()  # first act: where do we resume from?
    session = WorkerSession(WorkerArgs(**args), checkpoint)
    try:
        session.run()
    finally:
        session.close()


def _quiet_ray_train_logs() -> None:
    """Ray Train logs every report at INFO; we print what matters (restarts, resizes, checkpoints) ourselves."""
    from ray.train.v2._internal.execution import context as train_context

    logging.getLogger("ray.train").setLevel(logging.WARNING)
    logging.getLogger(train_context.__file__).setLevel(logging.WARNING)  # this one is named by file path


class Console:
    """Progress lines and a tqdm_ray bar on rank 0; silent elsewhere (no rank branches in the loop)."""

    def __init__(self, enabled: bool, bars: bool):
        self.enabled, self.bars, self.bar = enabled, bars, None
        self.last_line = 0.0

    def line(self, text: str) -> None:
        # sys.stdout.write, not print: Ray Train patches print() to also log, which doubles every line.
        if self.enabled:
            sys.stdout.write(f"[elastic-train] {text}\n")
            sys.stdout.flush()

    def epoch_bar(self, epoch: int, epochs: int, total: int, start: int) -> None:
        if not (self.enabled and self.bars):
            return
        from ray.experimental.tqdm_ray import tqdm

        self.close()
        self.bar = tqdm(total=total, desc=f"epoch {epoch + 1}/{epochs}", position=0)
        if start:
            self.bar.update(start)

    def progress(self, steps: int, desc: str) -> None:
        """Advance the bar; without bars (logs, CI), print a line at most every 10 s."""
        if self.bar is not None:
            self.bar.set_description(desc)
            self.bar.update(steps)
        elif time.monotonic() - self.last_line >= 10.0:
            self.last_line = time.monotonic()
            self.line(desc)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class WorkerSession:
    """One worker's life between (re)start and finish."""

    def __init__(self, args: WorkerArgs, checkpoint: Checkpoint | None):
        self.args = args
        self.cfg = JobConfig.model_validate(args.config)
        if not os.environ.get("ELASTIC_TRAIN_RAY_LOG_LEVEL"):
            _quiet_ray_train_logs()
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.device = ray.train.torch.get_device()
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.console = Console(self.rank == 0, bars=args.progress_bars)
        self._book_pushed = float("-inf")
        self.tracker: Tracker = tracker_for(args.tracking, self.rank)
        self._build()
        restored = self._restore(checkpoint)
        self._begin_attempt(restored, checkpoint)

    # ------------------------------------------------------------------------------ setup
    def _build(self) -> None:
        cfg = self.cfg
        self.bundle = ray.get(self.args.data_ref) if self.args.data_ref is not None else build_data(cfg)
        self.plan = BatchPlan(cfg.train.global_batch_size, self.world, cfg.train.micro_batch_size)
        self.data = WorkerData(
            self.bundle, self.plan, self.rank, cfg.seed, self.device, cfg.data.loader_workers, cfg.data.trace_path
        )
        model = build_model(cfg, self.bundle.spec)
        if cfg.train.compile:
            model.compile()  # in place: state_dict keys stay clean
        self.loss_fn = loss_function(cfg.train.compile)
        if cfg.scaling.strategy == "fsdp":
            from elastic_train.train.fsdp import shard_model

            self.model = shard_model(model, cfg, self.device)
        else:
            self.model = ray.train.torch.prepare_model(model, parallel_strategy="ddp")
        self.precision = Precision.create(cfg.train.precision, self.device, sharded=cfg.scaling.strategy == "fsdp")
        optimizer = make_optimizer(self.model, cfg.train)
        self.total_steps = cfg.train.epochs * self.data.steps_per_epoch
        scheduler = make_scheduler(optimizer, cfg.train, self.total_steps)
        self.state = TrainState(self.model, optimizer, scheduler, self.precision)
        self.state.record.run_name = self.args.run_name
        self.state.record.mlflow_run_id = self.args.tracking.run_id if self.args.tracking else None
        self.flops_per_sample = metric_math.flops_per_sample(self.model, self.bundle.spec, self.cfg)

    def _restore(self, checkpoint: Checkpoint | None) -> bool:
        if checkpoint is None:
            seed_everything(self.cfg.seed * 1000 + self.rank)
            return False
        with checkpoint.as_directory() as d:
            same_rng = self.state.load(d, self.rank, map_location=self.device)
        if not same_rng:  # a new world size: derive this rank's RNG from the position, deterministically
            seed_everything(self.cfg.seed * 1000 + self.rank + 7919 * self.state.progress.global_step)
        return True

    def _begin_attempt(self, restored: bool, checkpoint: Checkpoint | None) -> None:
        p, rec = self.state.progress, self.state.record
        previous = self._ledger_get()
        self.book = GoodputBook.from_dict(previous) if previous else GoodputBook()
        event = self.book.begin_attempt(
            time.time(),
            self.world,
            p.global_step if restored else None,
            rec.goodput if restored else None,
            rec.world_sizes,
        )
        # Step metrics are logged only after the last step MLflow holds (recomputed steps once, lost ones again).
        self.tracker.skip_logged_steps(max(self.args.log_floor, self.book.logged_step))
        where = self.device.type if self.device.type == "cuda" else f"cpu, {torch.get_num_threads()} threads each"
        self.console.line(f"worker group of {self.world} ({where}): {self.plan}")
        if event["restart"]:
            where = f"{Path(checkpoint.path).name} (epoch {p.epoch + 1}, step {p.step_in_epoch})" if checkpoint else "the start"
            resize = f", resized {event['previous_world_size']} -> {self.world} workers" if event["previous_world_size"] else ""
            self.console.line(
                f"restart {event['restarts']}: resumed from {where}{resize}; recomputing {event['recomputed_steps']} step(s)"
            )
            self.tracker.set_tags({"restarts": event["restarts"], "world_sizes": self.book.world_sizes})
        self.tracker.set_tags({"world_size": self.world, "batch_plan": str(self.plan)})
        self.tracker.log_metrics(
            {"world_size": self.world, "restarts": self.book.totals.restarts, "accum_steps": self.plan.accum_steps},
            step=p.global_step,
        )
        self._push_book(force=True)

    # ------------------------------------------------------------------------------ the loop
    def run(self) -> None:
        cfg, p = self.cfg, self.state.progress
        self.fault = FaultHook.parse(self.args.fault, self.rank)
        self.window = metric_math.Window(self.device)
        self.last_ckpt_time = time.monotonic()
        self.last_preempt_check = time.monotonic()
        self.preemption_saved = False
        first = True
        while p.epoch < cfg.train.epochs:
            epoch, start = p.epoch, p.step_in_epoch
            self.console.epoch_bar(epoch, cfg.train.epochs, self.data.steps_per_epoch, start)
            steps = self.data.epoch(epoch, start)
            while True:
                t0 = time.perf_counter()
                item = next(steps, None)
                self.window.data_wait_s += time.perf_counter() - t0
                if item is None:
                    break
                _, micro = item
                result = train_step(
                    self.model, micro, self.state.optimizer, self.state.scheduler, self.precision,
                    self.plan.loss_scale, cfg.train.grad_clip,
                    measure_grad_norm=self._sync_point(p.global_step + 1, (p.step_in_epoch + 1) % self.data.steps_per_epoch),
                    loss_fn=self.loss_fn,
                )
                p.advance(cfg.train.global_batch_size, self.data.steps_per_epoch)
                self.window.add(result)
                if first:
                    first = False
                    self._first_step()
                self.fault.maybe_fire(p.global_step)
                if self._sync_point(p.global_step, p.step_in_epoch):
                    flags = self._sync_and_log()
                    self._maybe_checkpoint(flags, epoch_end=p.step_in_epoch == 0)
        self._finish()

    def _sync_point(self, global_step: int, step_in_epoch: int) -> bool:
        """Steps where every rank all-reduces metrics and flags: log cadence, step checkpoints, epoch ends."""
        every = self.cfg.checkpoint.every_steps
        return (
            global_step % self.cfg.tracking.log_every_steps == 0
            or step_in_epoch == 0
            or bool(every and global_step % every == 0)
        )

    def _epoch_label(self) -> int:
        """1-based epoch in progress (the one just finished at an epoch boundary)."""
        p = self.state.progress
        return p.epoch if p.step_in_epoch == 0 else p.epoch + 1

    def _first_step(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.book.first_step_done(time.time())

    def _sync_and_log(self) -> dict[str, bool]:
        """All-reduce the window's sums (plus rank 0's control flags); log them; return the flags."""
        now = time.monotonic()
        ckpt_every = self.cfg.checkpoint.every_seconds
        flags = {
            "time_checkpoint": bool(ckpt_every and now - self.last_ckpt_time >= ckpt_every),
            "check_preemption": now - self.last_preempt_check >= PREEMPTION_CHECK_S,
        }
        totals, flags = self.window.reduce(self.rank, flags)
        p = self.state.progress
        self.state.record_epoch(totals)
        wall = self.window.elapsed()
        stats = metric_math.interval_metrics(totals, wall, self.window.data_wait_s, self.bundle.spec, self.flops_per_sample, self.device, self.cfg)
        stats["lr"] = self.state.scheduler.get_last_lr()[0]
        stats["epoch"] = p.epoch + (p.step_in_epoch / self.data.steps_per_epoch)
        self._log(stats, p.global_step)
        self.console.progress(
            int(totals["steps"]),
            f"epoch {self._epoch_label()}/{self.cfg.train.epochs} step {p.global_step} "
            f"loss {stats['train_loss']:.4f} {metric_math.speed_text(stats)}",
        )
        self.book.heartbeat(time.time(), p.global_step, wall, 0.0)
        self.throughput.add(totals["samples"], wall, warm=self.window.warm, data_wait_s=self.window.data_wait_s)
        self._push_book()
        self.window.reset()
        if flags["check_preemption"]:
            self.last_preempt_check = now
        return flags

    def _maybe_checkpoint(self, flags: dict[str, bool], epoch_end: bool) -> None:
        cfg, p = self.cfg, self.state.progress
        reason = None
        if p.epoch >= cfg.train.epochs and epoch_end:
            reason = "final"
        elif epoch_end and cfg.checkpoint.at_epoch_end:
            reason = "epoch end"
        elif cfg.checkpoint.every_steps and p.global_step % cfg.checkpoint.every_steps == 0:
            reason = f"every {cfg.checkpoint.every_steps} steps"
        elif flags["time_checkpoint"]:
            reason = f"every {cfg.checkpoint.every_seconds:g} s"
        if flags["check_preemption"] and not self.preemption_saved:
            info = ray.train.get_preemption_info()  # a barrier: every rank reaches it on the same step
            if info is not None:
                self.preemption_saved = True
                left = (info.deadline_ms / 1000 - time.time()) if info.deadline_ms else float("nan")
                self.console.line(f"preemption of node(s) {info.preempted_node_ids}; {left:.0f} s left: saving now")
                reason = "preemption"  # a checkpoint due anyway now doubles as the just-in-time one
        if reason is not None:
            self.checkpoint(reason)

    # ------------------------------------------------------------------------------ checkpoints
    def checkpoint(self, reason: str) -> dict[str, Any]:
        """Evaluate, save every rank's part, and report with asynchronous upload."""
        t0 = time.perf_counter()
        p = self.state.progress
        final = reason == "final"
        metrics = self._evaluate()
        metrics.update({"epoch": p.epoch, "global_step": p.global_step, "samples_seen": p.samples_seen,
                        "world_size": self.world, "restarts": self.book.totals.restarts, "reason": reason})
        metrics.update(self.state.epoch_metrics(self.bundle.spec.tokens_per_sample))
        goodput = {f"goodput_{k}": v for k, v in self.book.totals.summary().items()}
        self._log({**{k: v for k, v in metrics.items() if k.startswith("val_")}, **goodput}, p.global_step, final)
        self.console.close()
        self.console.line(
            f"epoch {self._epoch_label()}/{self.cfg.train.epochs} step {p.global_step}: "
            + " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith(("val_", "train_loss")))
            + f" [checkpoint: {reason}]"
        )
        if final:
            metrics.update(self._final_metrics())
        self.state.record.goodput = self.book.totals
        self.state.record.world_sizes = list(self.book.world_sizes)
        directory = tempfile.mkdtemp(prefix="elastic-train-ckpt-")
        self.state.save(directory, self.rank, meta={"metrics": metrics, "config": self.args.config,
                                                    "data_spec": asdict(self.bundle.spec),
                                                    "batch_plan": self.plan.describe(), "reason": reason})
        ray.train.report(
            metrics,
            checkpoint=Checkpoint.from_directory(directory),
            checkpoint_dir_name=checkpoint_dir_name(p),
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        )
        blocked = time.perf_counter() - t0
        self.book.heartbeat(time.time(), p.global_step, 0.0, blocked)
        self._push_book(force=True)
        self.last_ckpt_time = time.monotonic()
        self.window.reset()
        return metrics

    def _log(self, metrics: dict[str, Any], step: int, always: bool = False) -> None:
        """Log step metrics; unless ``always``, the tracker skips steps the run already holds."""
        self.tracker.log_metrics(metrics, step=step, unless_logged=not always)
        self.book.logged_step = max(self.book.logged_step, step)

    def _evaluate(self) -> dict[str, float]:
        batches = self.data.val_batches(self._eval_batch(), equal_counts=self.state.sharded)  # FSDP: lockstep
        totals = evaluate(self.model, batches, self.precision, self.device)
        if self.world > 1:
            dist.all_reduce(totals)
        loss_sum, correct, n = totals.tolist()
        return metric_math.eval_metrics(loss_sum, correct, n, self.bundle.spec)

    def _eval_batch(self) -> int:
        return max(self.plan.micro_batch_size, 256 if self.bundle.spec.kind == "classification" else 8)

    def _final_metrics(self) -> dict[str, Any]:
        sd = self.state.model_state_dict()  # collective for sharded models: every rank calls it
        unsent = self.tracker.close(timeout_s=60)
        self.tracker = tracker_for(None, self.rank)
        return {
            "params_sha256": params_sha256(sd) if self.rank == 0 else "",
            "samples_per_second": self.throughput.rate(),
            "samples_per_second_median": self.throughput.median_rate(),
            "first_step_unix": self.book.first_step_unix,
            "goodput": self.book.totals.summary(),
            "world_sizes": list(self.book.world_sizes),
            "tracking_unsent": unsent.get("unsent", 0),
            "tracking_spool": unsent.get("spool_path"),
            "steps_per_epoch": self.data.steps_per_epoch,
            **self.perf_summary(),
        }

    def perf_summary(self) -> dict[str, Any]:
        return metric_math.perf_summary(self.throughput, self.bundle.spec, self.flops_per_sample, self.device, self.cfg)

    def _finish(self) -> None:
        p = self.state.progress
        if p.epoch >= self.cfg.train.epochs and not self.window.empty:
            self._maybe_checkpoint(self._sync_and_log(), epoch_end=True)

    def _push_book(self, force: bool = False) -> None:
        """Rank 0 saves the goodput book to the ledger (fire and forget), at most every 0.25 s unless forced."""
        if self.args.ledger is None or self.rank != 0:
            return
        now = time.monotonic()
        if force or now - self._book_pushed >= 0.25:
            self._book_pushed = now
            self.args.ledger.put.remote(self.book.to_dict())

    def _ledger_get(self) -> dict[str, Any] | None:
        """Rank 0 reads the run's goodput book; accounting must never stop training, so errors are None."""
        if self.args.ledger is None or self.rank != 0:
            return None
        try:
            return ray.get(self.args.ledger.get.remote(), timeout=30)
        except Exception as e:  # noqa: BLE001
            self.console.line(f"goodput ledger unavailable ({type(e).__name__}); accounting restarts")
            return None

    @property
    def throughput(self) -> metric_math.Throughput:
        if not hasattr(self, "_throughput"):
            self._throughput = metric_math.Throughput()
        return self._throughput

    def close(self) -> None:
        self.console.close()
        self.data.close()
        self.tracker.close(timeout_s=10)


class FaultHook:
    """Test-only hooks from ``$ELASTIC_TRAIN_FAULT`` (comma-separated ``key=value``):

    * ``step=K,rank=R,marker=PATH,mode=exit|raise`` -- at global step K, rank R dies once per marker file:
      ``exit`` kills the process outright (as a lost node would), ``raise`` throws from the training function.
    * ``delay=SECONDS`` -- every rank pauses this long after each step, to stretch a short run while a test
      removes and adds nodes.
    """

    def __init__(self, step: int | None = None, marker: str | None = None, mode: str = "exit", delay: float = 0.0):
        self.step, self.marker, self.mode, self.delay = step, marker, mode, delay

    @classmethod
    def parse(cls, spec: str | None, rank: int) -> FaultHook:
        if not spec:
            return cls()
        parts = dict(kv.split("=", 1) for kv in spec.split(",") if "=" in kv)
        delay = float(parts.get("delay", 0.0))
        if "step" not in parts or int(parts.get("rank", 0)) != rank:
            return cls(delay=delay)
        return cls(int(parts["step"]), parts.get("marker"), parts.get("mode", "exit"), delay)

    def maybe_fire(self, global_step: int) -> None:
        if self.delay:
            time.sleep(self.delay)
        if self.step is None or global_step != self.step:
            return
        if self.marker:
            if os.path.exists(self.marker):
                return
            Path(self.marker).write_text(str(global_step))
        if self.mode == "raise":
            raise RuntimeError(f"injected fault at step {global_step}")
        os._exit(1)
