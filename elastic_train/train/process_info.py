"""Facts about this OS process that the restart timelines need (Linux ``/proc``; None elsewhere). No Ray."""

from __future__ import annotations

import os
import time


def process_start_unix() -> float | None:
    """This process's start as unix time (Linux: ``/proc/self/stat`` field 22, in clock ticks since boot, plus the
    boot time as ``now - /proc/uptime``: to about 10 ms; ``btime`` in /proc/stat is whole seconds); None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        # field 2 (comm) is in parentheses and may hold spaces: split after its closing one
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[19])  # field 22 overall: starttime, in clock ticks since boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        now = time.time()
        start = now - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return min(start, now)  # never a start in the future
