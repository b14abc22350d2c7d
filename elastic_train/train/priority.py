"""Niceness: Ray starts every worker process at 15; the processes a run waits on get 0 back."""

from __future__ import annotations

import os


def normal_priority(pid: int | None = None) -> None:
    """Run this worker's threads at niceness 0, as the plain process a user would train in.

    Ray's raylet starts every worker process at niceness 15 (RayConfig ``worker_niceness``; only job drivers get
    0). A training worker that owns its CPUs then loses each time slice to any nice-0 process that wakes up
    (Ray's own daemons, the driver, a neighbour), and with intra-op threads one preempted thread stalls the
    whole op: measured on 2 cores, the small GPT at 0.86 of a plain loop and the MLP at 0.69 (its MLflow
    sender, niced 4 steps further, took nearly an equal share). Threads created later (torch's pool, the
    tracker's) inherit the calling thread's value. Lowering niceness needs privilege (root, CAP_SYS_NICE):
    without it the worker stays where Ray put it. ``pid``: another process's threads instead (a warm spare's
    while it imports: train/spares.py)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task")]
    except OSError:  # not Linux: the process's value
        tids = [pid or 0]
    for tid in tids:
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) > 0:
                os.setpriority(os.PRIO_PROCESS, tid, 0)
        except OSError:
            pass
