"""Warm spare worker processes: a restarted worker group starts on processes that have already imported torch.

When a worker dies, Ray Train tears the whole group down and creates a new one: on a 2-core machine the new
processes cost ~4.4 s of start-up (an interpreter importing Ray, torch and Ray Train) of the ~8.6 s a recovery
took (docs/benchmarks.md). Ray's raylet hands an actor an **idle** worker process when one fits: same job, same
runtime environment (by hash), never used for a task. So each node keeps ``failure.spare_workers`` such
processes ready:

* The Train workers' runtime environment carries a setup hook (``warmup.preload``; Ray runs it in every worker
  process of that environment before the process takes work) that imports what a training worker needs and
  then leaves a file named by its pid in :data:`WARM_DIR` (warm).
* Once an attempt has taken its first step, a Train worker's keeper (``warmup.SpareKeeper``, one at a time per
  raylet) asks its raylet to prestart the missing spares with *its own* runtime environment string (so the
  hash is the same) and a keep-alive (Ray's ``PrestartWorkers``; compat/ray_core.py). It counts the spares
  already there from ``/proc`` (:func:`local_workers`: this job's idle processes under this raylet that carry
  the environment's marker; ``auto`` wants one per busy Train worker there), and tops them up again after each
  checkpoint: a restart uses them up, a keep-alive that ran out lets Ray reap them.
* On a restart the raylet gives each new Train worker a spare (the newest first); the process start is gone
  from the recovery. Nothing of a run is in a spare: it has imported modules and run no task.

Ray starts a spare at its worker niceness (15); its keeper puts it at 0, as training workers are, or on a
machine whose cores training fills it would import for as long as training runs (measured: not warm after a
minute on 2 cores). Its start costs ~8 s of one core, once; warm, it uses ~1 % of a core and ~0.45 GB of
memory (docs/faults.md#warm-spares). Spares end with the job (Ray reaps a finished job's idle workers) or,
within a long-lived driver, once their keep-alive has run out and their node has more idle workers than free
CPUs; a later run of the same job and environment (a sweep's next trial, a notebook's next run) starts on
them. This module is the part without Ray (the fault injector's ``when=spares-warm`` reads it too).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

PRELOAD = "elastic_train.train.warmup.preload"  # the setup hook, as Ray's load_class reads it (module.function)
MARKER_ENV = "ELASTIC_TRAIN_SPARE_OF"  # in the Train workers' env: which environment a spare was made for
KEEP_ALIVE_S = 300  # Ray reaps a spare past this only when its node has more idle workers than free CPUs
RPC_TIMEOUT_S = 5.0
WARM_DIR = Path(tempfile.gettempdir()) / "elastic-train-spares"  # a file per warm spare, named by its pid


def mark_warm() -> None:
    """This process (a spare, or a Train worker's first process) has imported what training needs."""
    with contextlib.suppress(OSError):
        WARM_DIR.mkdir(parents=True, exist_ok=True)
        (WARM_DIR / str(os.getpid())).touch()


def warm(pids: list[int]) -> list[int]:
    """Those of ``pids`` whose preload is done (:func:`preload` leaves a file named by its pid)."""
    return [p for p in pids if (WARM_DIR / str(p)).exists()]


def forget_gone(alive: set[int]) -> None:
    """Remove the warm files of processes that are gone (a pid is reused only after its process ended)."""
    with contextlib.suppress(OSError):
        for f in WARM_DIR.iterdir():
            if f.name.isdigit() and int(f.name) not in alive and not Path(f"/proc/{f.name}").exists():
                f.unlink(missing_ok=True)


def this_node() -> tuple[list[int], list[int]]:
    """``(idle, busy)`` of this Train worker's raylet (see :func:`local_workers`), from its own environment."""
    env = os.environ
    if not {"RAY_JOB_ID", MARKER_ENV, "RAY_RAYLET_PID"} <= env.keys():
        return [], []
    return local_workers(env["RAY_JOB_ID"], env[MARKER_ENV], env["RAY_RAYLET_PID"])


def worker_env(setup_hook_env: str, existing: Mapping[str, str]) -> dict[str, str]:
    """The env vars that make Train workers (and their spares) warm: the setup hook, unless the job already has
    one of its own (``existing``: the job's env vars; one hook per process, and the user's wins), and the
    marker that names this environment (a digest of what else the workers get, so spares made for another
    environment are not counted as this one's)."""
    env = {} if setup_hook_env in existing else {setup_hook_env: PRELOAD}
    digest = hashlib.sha256(json.dumps({**existing, **env}, sort_keys=True).encode()).hexdigest()[:12]
    return {**env, MARKER_ENV: digest}


def local_workers(job_id_hex: str, marker: str, raylet_pid: str,
                  proc: Path = Path("/proc")) -> tuple[list[int], list[int]]:
    """``(idle, busy)``: pids of the worker processes of job ``job_id_hex`` under the raylet ``raylet_pid``
    (``$RAY_RAYLET_PID``: one machine may run several raylets) made for the environment ``marker``. Idle ones
    (starting ones included) are spares; busy ones are the Train workers (only they carry the marker). Linux
    ``/proc``; empty elsewhere or when unreadable."""
    want = {f"RAY_JOB_ID={job_id_hex}".encode(), f"{MARKER_ENV}={marker}".encode(),
            f"RAY_RAYLET_PID={raylet_pid}".encode()}
    idle, busy = [], []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return [], []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if not want <= set((entry / "environ").read_bytes().split(b"\0")):
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        waiting = cmdline.startswith(b"ray::IDLE") or b"default_worker.py" in cmdline or b"setup_worker.py" in cmdline
        (idle if waiting else busy).append(int(entry.name))
    return sorted(idle), sorted(busy)
