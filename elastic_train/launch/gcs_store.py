"""The GCS's Redis, watched from the driver: one line when the Redis that GCS fault tolerance keeps the cluster's
tables in stops answering, one when it answers again.

What Ray 2.60 does then, measured on separate hosts (``cluster.sim up --gcs-ft``, the Redis SIGKILLed mid-run;
docs/clusters.md "Head loss"): the GCS logs every failed Redis command and retry (~200 lines in 3 s, which the log
monitor forwards to every driver: ``RAY_DEDUP_LOGS_SKIP_REGEX`` drops them, launch/quiet.py) and exits after its
fifth failed PING; the raylets and the driver follow once they have waited ``RAY_gcs_rpc_server_reconnect_timeout_s``
(60 s) for a GCS. Nobody says why in a line: this watch does. The run's data is not lost: its checkpoints are in
storage and its MLflow run on the tracking server; with the Redis back and the head started again, the job
submitted again resumes by name.

The driver runs on the head, in the environment ``ray start --head`` was given: ``RAY_REDIS_ADDRESS`` (set by
start-head.sh's user, and by KubeRay from ``gcsFaultToleranceOptions``); without it there is nothing to watch. A
probe is a TCP connect and an inline ``PING``: any reply (``+PONG``, or ``-NOAUTH`` from a Redis with a password)
means it answers, so the watch needs no password. Public only: a socket, no Ray internals.

The watch is a small process of its own (``python -m elastic_train.launch.gcs_store ADDRESS PARENT_PID``), writing
to the driver's stderr, not a thread of the driver: once the GCS is gone, the driver's Ray threads (its log and
error-message subscribers) retry in C++ holding the GIL, and a watch thread there never ran again (seen with
py-spy in a job submitted to a head whose Redis was killed: the line never came). It ends with its parent.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time

log = logging.getLogger(__name__)

INTERVAL_S = 2.0
TIMEOUT_S = 2.0
AWAY_LINE = ("the GCS's Redis at {address} does not answer ({why}): Ray's GCS exits within seconds and this cluster "
             "about a minute later (RAY_gcs_rpc_server_reconnect_timeout_s) unless a head is started again with the "
             "Redis back; the run's checkpoints and MLflow run stay: submit the job again and it resumes by name")
_watcher: subprocess.Popen | None = None


def probe(address: str, timeout_s: float = TIMEOUT_S) -> str | None:
    """None when the Redis at ``address`` (HOST:PORT) answers a PING; else why not, in a few words."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except (OSError, ValueError) as e:
        return getattr(e, "strerror", None) or str(e)
    return None if reply[:1] in (b"+", b"-") else "closed the connection without a reply"


class RedisWatch:
    """The watch's state: :meth:`check` probes ``address`` and logs each change (away, back) once; the watch's
    process (:func:`_main`) calls it every ``interval_s``."""

    def __init__(self, address: str, interval_s: float = INTERVAL_S, timeout_s: float = TIMEOUT_S):
        self.address, self.interval_s, self.timeout_s = address, interval_s, timeout_s
        self.away_since: float | None = None

    def check(self) -> None:
        """One probe; a line when the answer changed."""
        why = probe(self.address, self.timeout_s)
        if why is not None and self.away_since is None:
            self.away_since = time.monotonic()
            log.warning("warning: " + AWAY_LINE.format(address=self.address, why=why))
        elif why is None and self.away_since is not None:
            log.warning("the GCS's Redis at %s answers again (away %.0f s)", self.address,
                        time.monotonic() - self.away_since)
            self.away_since = None


def watch_from_environment() -> subprocess.Popen | None:
    """Start this process's watch when the head runs with GCS fault tolerance (``RAY_REDIS_ADDRESS``); once. The
    watch is a child process (module docstring) that shares this process's stderr and ends with it."""
    global _watcher
    address = os.environ.get("RAY_REDIS_ADDRESS", "").split(",")[0].strip().split("://")[-1]
    if not address or _watcher is not None:
        return _watcher
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        _watcher = subprocess.Popen([sys.executable, "-m", __name__, address, str(os.getpid())], env=env,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)
    except OSError as e:  # no watch: the run goes on, the reason is said once
        log.warning("warning: cannot watch the GCS's Redis at %s (%s): its loss would not be reported", address, e)
    return _watcher


def _main(address: str, parent: int) -> int:
    """The watch's process: probe until the parent is gone. Ctrl-C is the driver's to handle, not ours."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch = RedisWatch(address)
    while os.getppid() == parent:
        watch.check()
        time.sleep(watch.interval_s)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], int(sys.argv[2])))
