"""The Ray Train entry points: ``train_loop_per_worker`` and ``evaluate_loop_per_worker``. The only module in
``train/`` that calls Ray.

Written for restarts (DESIGN invariants 1-4): the first act is ``ray.train.get_checkpoint()``; everything
after it is a :class:`~elastic_train.train.session.Session`, handed what Ray knows (rank, world size, device)
and what it does (``report`` at checkpoint cadence with asynchronous upload, ``get_preemption_info``, the
run's goodput ledger) as plain values and callables. Rank 0 logs to MLflow through a tracker that is a no-op
on the other ranks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import Checkpoint, CheckpointUploadMode

from elastic_train import runlog
from elastic_train.compat import features
from elastic_train.config import JobConfig
from elastic_train.data import build_data
from elastic_train.train.console import Console
from elastic_train.train.evaluator import evaluate_weights
from elastic_train.train.faults import FAULT_ENV, FaultHook
from elastic_train.train.fence import AttemptFence
from elastic_train.train.goodput import GoodputReporter
from elastic_train.train.priority import normal_priority
from elastic_train.train.process_info import process_start_unix
from elastic_train.train.resources import RunResources
from elastic_train.train.session import Host, Session
from elastic_train.train.state import RunRecord, upload_checkpoint
from elastic_train.train.uploads import Uploads
from elastic_train.train.warmup import SpareKeeper
from tracking import TrackingSpec, tracker_for

__all__ = ["FAULT_ENV", "RunResources", "WorkerArgs", "evaluate_loop_per_worker", "train_loop_per_worker"]


@dataclass
class WorkerArgs:
    """What the driver hands every worker (through ``train_loop_config``)."""

    config: dict[str, Any]
    run_name: str
    tracking: TrackingSpec | None = None
    resources: RunResources = field(default_factory=RunResources)  # the run's non-config values (resources.py)
    fault: str | None = None
    progress_bars: bool = False  # tqdm_ray bars when the driver writes to a terminal, else plain lines
    launched: float | None = None  # unix time the driver was launched: goodput's startup counts from it
    watch_preemption: bool = True  # Ray Train runs its PreemptionWatcher (off on an embedded Ray: launch/trainer.py)
    # The run's folder in storage, as (pyarrow filesystem, path): where Ray Train puts its checkpoints, passed by the
    # driver, which chose it (RunConfig's storage_path / name). Ray Train's own view of it (``get_storage()``) is a
    # DeveloperAPI "that may change without notice between minor versions".
    run_store: tuple[Any, str] | None = None


def train_loop_per_worker(args: dict[str, Any]) -> None:
    entered = time.time()
    normal_priority()
    wargs = WorkerArgs(**args)
    runlog.attach(wargs.resources.run_folder)  # what this worker lets go, once each, to the run's log on its node
    checkpoint = ray.train.get_checkpoint()  # first act: where do we resume from?
    store = wargs.run_store
    checkpoint, unregistered, attempt = _newest_checkpoint(checkpoint, store)  # and which attempt of the run are we?
    res = wargs.resources
    fence = _fence(attempt, store)
    adopt = checkpoint is None and res.start_from is not None
    if adopt:  # this run has no checkpoint of its own yet: continue the donor's
        checkpoint = Checkpoint(res.start_from)
    cfg = JobConfig.model_validate(wargs.config)
    if not os.environ.get("ELASTIC_TRAIN_RAY_LOG_LEVEL"):
        _quiet_ray_train_logs()
    host = _host(wargs, fence, cfg.failure.spare_workers, cfg.failure.spares_after_s, elastic=cfg.scaling.elastic)
    host.fault.note("entered", at=entered, process_start=process_start_unix())
    if host.rank == 0 and checkpoint is None and (nice := os.getpriority(os.PRIO_PROCESS, 0)) > 0:
        host.console.line(f"workers run at niceness {nice} (Ray's default is 15) and this process may not lower it: "
                          "on a machine training fills, start Ray with RAY_worker_niceness=0 (docs/clusters.md)")
    bundle = ray.get(res.data_ref) if res.data_ref is not None else build_data(cfg)
    record = RunRecord(run_name=wargs.run_name, mlflow_run_id=wargs.tracking.run_id if wargs.tracking else None)
    session = Session(cfg, host, bundle, config=wargs.config, record=record, log_floor=res.log_floor)
    if fence is not None:  # a worker cut off while the run restarted without it writes no trace line
        session.data.trace.fence(fence.attempt, fence.may_write)
    if unregistered and host.rank == 0:
        host.console.line(f"{unregistered} is complete on storage but Ray Train had not registered it (a worker "
                          "group failed before the controller collected every rank's report): registered now, "
                          "resuming from it")
    if checkpoint is None:
        session.start(None)
    else:
        with checkpoint.as_directory() as d:
            session.start(d, Path(checkpoint.path).name, adopt_as=RunRecord(
                run_name=wargs.run_name, mlflow_run_id=record.mlflow_run_id) if adopt else None)
    try:
        session.run()
        session.finish_uploads()  # the final checkpoint durable, measured: the run's book is complete
        host.fault.note("trained")
    finally:
        session.close()
        if fence is not None:
            fence.stop()
        host.fault.note("closed")


def _newest_checkpoint(registered: Checkpoint | None,
                       store: tuple[Any, str] | None) -> tuple[Checkpoint | None, str | None, int | None]:
    """Ray Train's latest registered checkpoint, or a newer one this run's storage holds complete.

    Ray Train registers a checkpoint once the controller has polled every rank's report; when a worker group
    fails, the reports it has not collected yet are dropped (``before_worker_group_shutdown``), although every
    rank's part is already on storage. Resuming from the registered one would recompute a checkpoint interval
    or more, so rank 0 looks for newer complete ones (:func:`_unregistered_on_storage`, which also deletes what
    no retention would ever delete), and every rank reports them to Ray Train again, oldest first, as the
    checkpoints they are (``NO_UPLOAD``: already on storage, with the metrics they were reported with): Ray
    Train registers them, resumes from the newest, and its retention (``checkpoint.keep`` by
    ``checkpoint.score``) deletes them in their turn. An unregistered folder outlived ``checkpoint.keep``
    before (issue 51: 8 checkpoints left with keep=2 after three killed workers). Rank 0 also claims this worker
    group's attempt (train/fence.py) and every rank takes it. Returns ``(checkpoint, name of the newest
    unregistered one or None, attempt or None)``. ``store``: the run's folder (filesystem, path), from the driver.
    """
    import torch.distributed as dist

    choice: list[Any] = [[], None]
    if ray.train.get_context().get_world_rank() == 0 and store is not None:
        choice[0] = _unregistered_on_storage(registered, *store)
        choice[1] = _claim_attempt(*store)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(choice, src=0)
    if not choice[0]:
        return registered, None, choice[1]
    fs, root = store
    for name, metrics in choice[0]:  # every rank: a report is a collective
        found = Checkpoint(f"{root}/{name}", filesystem=fs)
        ray.train.report(metrics, checkpoint=found, checkpoint_dir_name=name,
                         checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
    return found, choice[0][-1][0], choice[1]


def _claim_attempt(fs: Any, root: str) -> int | None:
    """Rank 0: write the run's next attempt marker (train/fence.py). None when storage refuses it: the run goes
    on unfenced (its first checkpoint meets the same storage and fails properly there)."""
    try:
        return AttemptFence.claim(fs, root).attempt
    except Exception as e:  # see above
        logging.getLogger(__name__).warning("no attempt fence (%s): writes from a cut-off worker are not refused", e)
        return None


def _fence(attempt: int | None, store: tuple[Any, str] | None) -> AttemptFence | None:
    """Every rank's view of its attempt, watched (per-step writes check its flag)."""
    if attempt is None or store is None:
        return None
    return AttemptFence(store[0], store[1], attempt).watch()


def _unregistered_on_storage(registered: Checkpoint | None, fs: Any, root: str) -> list[tuple[str, dict[str, Any]]]:
    """Rank 0, while no worker group runs (nothing uploads): the complete checkpoints in this run's storage folder
    newer than Ray Train's latest and not registered, oldest first, each with the metrics it was reported with.
    Every other folder Ray Train does not hold is deleted: incomplete ones (an upload a failure cut short) and
    complete ones it will never register (older than its latest). Without Ray Train's list of what it holds
    (``ray.train.get_all_reported_checkpoints``) nothing is deleted. A storage that cannot be listed or read
    leaves Ray Train's choice; the run's log says so."""
    floor = Path(registered.path).name if registered is not None else ""
    try:
        held = _held_by_ray_train()
        newer, garbage = [], []
        for name in checkpoint_folders(fs, root):
            if name == floor or (held is not None and name in held):
                continue
            if name > floor and complete_on_storage(fs, f"{root}/{name}"):  # fixed-width steps: names sort by step
                newer.append((name, reported_metrics(fs, f"{root}/{name}")))
            elif held is not None:
                garbage.append(name)
    except Exception as e:
        runlog.dropped("looking for checkpoints Ray Train had not registered: resuming from its latest, and "
                       "storage may keep checkpoints beyond checkpoint.keep", e)
        return []
    for name in garbage:
        try:
            fs.delete_dir(f"{root}/{name}")
        except Exception as e:  # left behind, said once
            runlog.dropped(f"deleting {name}, a checkpoint Ray Train does not hold (left in storage)", e,
                           once="delete unregistered")
    return newer


def _held_by_ray_train() -> set[str] | None:
    """The names of the checkpoints Ray Train holds (registered, not yet deleted by its retention); None where
    this Ray has no such call."""
    reported = getattr(ray.train, "get_all_reported_checkpoints", None)
    if reported is None:
        return None
    from ray.train import CheckpointConsistencyMode

    held = reported(consistency_mode=CheckpointConsistencyMode.COMMITTED, timeout_s=30)
    return {Path(r.checkpoint.path).name for r in held}


def checkpoint_folders(fs: Any, root: str) -> list[str]:
    import pyarrow.fs

    listing = fs.get_file_info(pyarrow.fs.FileSelector(root, allow_not_found=True))
    return sorted(i.base_name for i in listing
                  if i.type == pyarrow.fs.FileType.Directory and i.base_name.startswith("checkpoint_"))


def reported_metrics(fs: Any, path: str) -> dict[str, Any]:
    import json

    with fs.open_input_stream(f"{path}/meta.json") as f:
        return dict(json.loads(f.read().decode()).get("metrics") or {})


def complete_on_storage(fs: Any, path: str) -> bool:
    """Every rank's part of the checkpoint at ``path`` is there: meta.json and train_state.pt, each saved rank's
    RNG state, and the model: rank 0's model.pt (DDP) or every rank's shard files and the index (FSDP).

    Checked while no worker group is running (a restart, a resumed driver), so nothing is uploading into it."""
    import json

    import pyarrow.fs

    def files(sub: str) -> list[str]:
        infos = fs.get_file_info(pyarrow.fs.FileSelector(f"{path}/{sub}", allow_not_found=True))
        return [i.base_name for i in infos if i.type == pyarrow.fs.FileType.File]

    top = set(files(""))
    if not {"meta.json", "train_state.pt"} <= top:
        return False
    with fs.open_input_stream(f"{path}/meta.json") as f:
        meta = json.loads(f.read().decode())
    world = int(meta.get("metrics", {}).get("world_size") or 0)
    if world < 1:
        return False
    rng = set(files("rng"))
    if any(f"rank_{r}.pt" not in rng for r in range(world)):
        return False
    shards = files("dcp")  # FSDP: every rank's shard file and rank 0's index; DDP: rank 0's model.pt
    if not shards:
        return "model.pt" in top
    return ".metadata" in shards and all(any(s.startswith(f"__{r}_") for s in shards) for r in range(world))


def _host(args: WorkerArgs, fence: AttemptFence | None = None, spare_workers: int | str = 0,
          spares_after_s: float = 0.0, elastic: bool = False) -> Host:
    """This worker's place in the group, its console and tracker, and Ray Train's calls as plain callables;
    the keeper of its node's ``spare_workers`` (train/spares.py), started ``spares_after_s`` into training."""
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    console = Console(rank == 0, bars=args.progress_bars)
    spec = args.tracking
    # rank 0's own sender fences itself in the tracking store (tag, per batch); a sweep's relay (one writer per
    # run, on the driver's node) needs no fence
    res = args.resources
    if spec is not None and fence is not None and res.tracking_relay is None:
        spec = dataclasses.replace(spec, attempt=fence.attempt)
    tracker = tracker_for(spec, rank, res.tracking_relay)
    ledger = res.ledger if rank == 0 else None
    fault = FaultHook.from_env(rank, args.fault)
    spares = SpareKeeper.for_this_worker(spare_workers, spares_after_s, fault.note)
    uploads = Uploads(console.line)
    return Host(
        rank, world, device, console, tracker,
        goodput=GoodputReporter(ledger, console.line, args.launched),
        fault=fault,
        report=partial(_report, fence, args.run_store, uploads),
        preemption_info=ray.train.get_preemption_info if args.watch_preemption else None,
        ray_train_run_id=_train_run_id() if elastic else None,
        attempt=fence.attempt if fence is not None else None,
        keep_spares=spares.start if spares is not None else None,
        uploads=uploads,
    )


def _train_run_id() -> str | None:
    """Ray Train's id of this run (one per controller, i.e. per driver), for launch/reservations.py: only elastic
    runs reserve workers with the coordinator, and only ``dead_run_requests`` releases them (None otherwise)."""
    if not features.enabled("dead_run_requests"):
        return None
    from elastic_train.compat.ray_train import train_run_id

    try:
        return train_run_id()
    except Exception as e:
        logging.getLogger(__name__).warning("no Ray Train run id in this worker (%s): a resumed driver may wait "
                                            "out this run's resource reservation (180 s)", e)
        return None


def _report(fence: AttemptFence | None, store: tuple[Any, str] | None, uploads: Uploads, metrics: dict[str, Any],
            directory: str, name: str) -> None:
    """Report a checkpoint (every rank's part is in ``directory``); training goes on while it uploads, once this
    rank's previous upload is durable (at most one in flight: train/uploads.py). A rank whose attempt was
    superseded (cut off while the run restarted without it) raises instead: nothing is uploaded."""
    if fence is not None:
        fence.check(f"checkpoint {name}")
    uploads.before_report(name, int(metrics.get("global_step") or 0))
    ray.train.report(
        metrics,
        checkpoint=Checkpoint.from_directory(directory),
        checkpoint_dir_name=name,
        checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        **({"checkpoint_upload_fn": partial(_upload, store, uploads)} if store is not None else {}),
    )


def _upload(store: tuple[Any, str], uploads: Uploads, checkpoint: Checkpoint, name: str) -> Checkpoint:
    """Ray Train's upload into the run's folder, with ``meta.json`` last (state.upload_checkpoint), on Ray Train's
    upload thread; ``uploads`` learns when it is durable. The storage filesystem retries each request through a
    short outage (data/filesystems.py); past that the error fails this attempt, which restarts from the newest
    complete checkpoint."""
    fs, root = store
    dest = f"{root}/{name}"
    try:
        upload_checkpoint(checkpoint.path, fs, dest)
    except BaseException:
        uploads.finished(name, ok=False)
        raise
    uploads.finished(name, ok=True)
    return Checkpoint(dest, filesystem=fs)


class _RayInfoOff(logging.Filter):
    """Drops records below WARNING that Ray's own modules log (``pathname`` under Ray's package)."""

    def __init__(self) -> None:
        super().__init__()
        self.prefix = os.path.dirname(ray.__file__) + os.sep

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.pathname.startswith(self.prefix)


# Ray Train's record when the training function raised: "Error in training function:" and the traceback. When
# gloo lost a peer (its process or host gone: the group ends and restarts without it), ~20 lines down to torch's
# all_reduce for what one line says (issue 51, item 9). Keyed on Ray's text: if it changes, the traceback prints.
_TRAIN_FN_ERROR = "Error in training function:"
_PEER_LOST = re.compile(r"^RuntimeError: \[[^\]]*gloo[^\]]*\] .*?"
                        r"(Connection reset by peer|Connection closed by peer|Socket Timeout|Timed out waiting)",
                        re.MULTILINE)


class _PeerLostOneLine(logging.Filter):
    """Ray Train's traceback of a training function that gloo's lost peer ended becomes one line (above)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and str(record.msg).startswith(_TRAIN_FN_ERROR):
            lost = _PEER_LOST.search(record.getMessage())
            if lost is not None:
                record.msg, record.args, record.exc_info = (
                    f"[elastic-train] this worker's process group lost a peer (gloo: {lost.group(1)}); its group "
                    "ends and restarts without it", (), None)
        return True


def _quiet_ray_train_logs() -> None:
    """Ray Train logs every report at INFO; we print what matters (restarts, resizes, checkpoints) ourselves. Its
    ``ray.train`` logger at WARNING, and Ray's INFO records that reach the root logger's handlers (Ray Train's
    context logs under a logger named by its file's path, outside ``ray.train``) dropped there; a lost peer's
    traceback one line, on every handler a record of Ray Train's reaches (public :mod:`logging` only)."""
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _RayInfoOff) for f in handler.filters):
            handler.addFilter(_RayInfoOff())
    for name in ("", "ray", "ray.train"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _PeerLostOneLine) for f in handler.filters):
                handler.addFilter(_PeerLostOneLine())


def evaluate_loop_per_worker(args: dict[str, Any]) -> None:
    """Score the model in ``args["weights_ref"]`` on every worker's validation shard; rank 0 hands the
    all-reduced metrics to the driver through the ledger's ``put_final``."""
    normal_priority()  # evaluation fills the cores as training does
    cfg = JobConfig.model_validate(args["config"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    device = ray.train.torch.get_device()
    bundle = ray.get(args["data_ref"]) if args.get("data_ref") is not None else build_data(cfg)
    metrics = evaluate_weights(cfg, bundle, ray.get(args["weights_ref"]), rank, world, device)
    if rank == 0 and args.get("ledger") is not None:
        args["ledger"].put_final(metrics)
