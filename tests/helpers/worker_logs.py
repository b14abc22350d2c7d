"""What Ray workers wrote to stdout, read from their log files rather than the driver's console.

Ray forwards a worker's stdout to the driver asynchronously (its log monitor tails the worker's file), so a line
a worker printed may reach the driver's console after the job's ``main()`` has returned; a test asserting on
``capsys`` then races the forwarder. The worker's own file holds the line as soon as the worker flushed it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class WorkerLogs:
    """Marks where every worker ``*.out`` file of the session ends now; :meth:`since` reads what came after."""

    def __init__(self, ray: Any):
        self.dir = Path(ray._private.worker._global_node.get_logs_dir_path())
        self.offsets = {f: f.stat().st_size for f in self.dir.glob("worker-*.out")}

    def since(self) -> str:
        parts = []
        for f in sorted(self.dir.glob("worker-*.out")):
            with f.open("rb") as fh:
                fh.seek(self.offsets.get(f, 0))
                parts.append(fh.read().decode(errors="replace"))
        return "".join(parts)
