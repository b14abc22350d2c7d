"""Reaching Ray without ever hanging: which cluster to use, a TCP probe before ``ray.init``, and a bound on it.

``ray.init`` retries a GCS that does not answer forever (``Failed to connect to GCS at address ...`` every few
seconds), and with no address it follows ``$RAY_TMPDIR/ray/ray_current_cluster`` (default ``/tmp/ray``), which a
``ray start --head`` that died without ``ray stop`` leaves behind. So the driver decides first:

* ``--address`` / ``$RAY_ADDRESS`` (or ``auto``: the head in that file): it must answer a TCP connect within
  ``failure.connect_timeout_s``, and ``ray.init`` must return within the same bound again, else ConfigError
  naming the flag (or variable, or file) and the address: exit 2, nothing started. ``local`` = embedded.
* no address: a head in ``ray_current_cluster`` that answers is used (``ray start`` then plain jobs works);
  one that does not answer is reported in one warning line naming the file, and an embedded Ray starts
  (``address="local"``, never ``"auto"``, which would follow the file again).

No Ray import at module level: :func:`choose` and :func:`probe` are plain sockets and files.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from elastic_train.errors import ConfigError

log = logging.getLogger(__name__)

STALE_PROBE_S = 2.0  # how long a head named only by the leftover file gets to answer before we start our own


EMBEDDED = "embedded local Ray"  # how an embedded Ray is described (RunContext.ray_target, the header's "ray:" line)


@dataclass(frozen=True)
class RayTarget:
    """Where ``ray.init`` should go: ``address`` (``"local"`` starts an embedded Ray), how to describe it, and
    which input named it (for the exit-2 message)."""

    address: str
    how: str
    source: str = ""  # "--address", "RAY_ADDRESS", the file's path; "" for the embedded default
    warning: str | None = None
    via_file: bool = False  # found through ray_current_cluster: ray.init(address=None/"auto") reads it itself

    @property
    def embedded(self) -> bool:
        return self.address == "local"

    def init_address(self) -> str | None:
        """What to hand ``ray.init``. A head from the file goes as None/"auto" so that Ray turns on token auth
        for it as it does for a local head (an explicit address never does)."""
        if not self.via_file:
            return self.address
        return "auto" if self.source in ("--address", "RAY_ADDRESS") else None


def cluster_file(environ: Mapping[str, str] = os.environ) -> Path:
    """Ray's record of the last ``ray start`` head: ``<tmp>/ray/ray_current_cluster``, ``<tmp>`` as Ray picks it
    (``$RAY_TMPDIR``, else ``$TMPDIR`` on Linux, else ``/tmp``)."""
    base = environ.get("RAY_TMPDIR") or (environ.get("TMPDIR") if os.name == "posix" else None) or "/tmp"
    return Path(base) / "ray" / "ray_current_cluster"


def host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` (also ``ray://host:port``, ``[v6]:port``) -> (host, port); None when it names no port."""
    rest = address.split("://", 1)[1] if "://" in address else address
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def probe(address: str, timeout_s: float) -> str | None:
    """Try a TCP connect to ``address`` until it succeeds or ``timeout_s`` passes (a head may be starting).
    None when something listens there; else why not, in a few words."""
    hp = host_port(address)
    if hp is None:
        return "not host:port"
    deadline = time.monotonic() + timeout_s
    reason = "no answer"
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection(hp, timeout=max(0.05, min(left, 5.0))):
                return None
        except socket.gaierror as e:
            return f"unknown host ({e.strerror or e})"
        except ConnectionRefusedError:
            reason = "connection refused"
        except TimeoutError:
            reason = "no answer"
        except OSError as e:
            reason = e.strerror or str(e)
        if time.monotonic() + 0.2 >= deadline:
            return f"{reason} within {timeout_s:g}s"
        time.sleep(0.2)  # a refused connect returns at once: retry a few times a second until the deadline


def choose(address: str | None, timeout_s: float, environ: Mapping[str, str] = os.environ) -> RayTarget:
    """The cluster to connect to (see the module docstring). Raises ConfigError for an address that does not
    answer within ``timeout_s``."""
    if address:
        source, target = "--address", address
    elif environ.get("RAY_ADDRESS"):
        source, target = "RAY_ADDRESS", environ["RAY_ADDRESS"]
    else:
        return _default(timeout_s, environ)
    if target == "local":
        return RayTarget("local", EMBEDDED)
    if target.lower().startswith("ray://"):
        raise ConfigError(source, target, "Ray Client (ray://) is not supported: the run's controller, callbacks "
                                          "and key-value records need a driver on the cluster. Submit it there "
                                          "(ray job submit --address http://HEAD:8265 -- python -m jobs...) or "
                                          "give the head's GCS address (HEAD:6379)")
    if target == "auto":
        path = cluster_file(environ)
        recorded = _read(path)
        if recorded is None:
            raise ConfigError(source, target, f"no local head: {path} does not exist (start one: ray start --head)")
        why = probe(recorded, timeout_s)
        if why is not None:
            raise ConfigError(source, target, f"{path} names a head at {recorded} that does not answer ({why}); "
                                              "`ray stop` removes the stale file, `ray start --head` starts one")
        return RayTarget(recorded, "local head (ray start)", source, via_file=True)
    why = probe(target, timeout_s)
    if why is not None:
        raise ConfigError(source, target, f"no Ray cluster answers there ({why}; failure.connect_timeout_s "
                                          "sets the wait); start it, fix the address, or unset it to run embedded")
    return RayTarget(target, f"cluster at {target}", source)


AUTH_PROBE_S = 5.0  # the GCS answers its cheapest call in milliseconds; an exit 2 must come within seconds


def client_token(environ: Mapping[str, str] = os.environ, automatic: bool = False) -> tuple[str | None, str]:
    """The token ``ray.init`` will send, and where it comes from. Ray sends one when ``RAY_AUTH_MODE=token``
    (for an explicit address, only then) or, for the head it finds itself (``automatic``), whenever one is
    available: ``$RAY_AUTH_TOKEN``, else the file ``$RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``. A
    ``RAY_AUTH_MODE`` that is set is respected either way (``disabled``: no token, also for that head)."""
    mode = environ.get("RAY_AUTH_MODE")
    if (mode is not None and mode.lower() != "token") or (mode is None and not automatic):
        return None, "RAY_AUTH_MODE is not token"
    if environ.get("RAY_AUTH_TOKEN"):
        return environ["RAY_AUTH_TOKEN"].strip(), "$RAY_AUTH_TOKEN"
    path = Path(environ.get("RAY_AUTH_TOKEN_PATH") or Path(environ.get("HOME", "~")).expanduser() / ".ray" /
                "auth_token")
    try:
        return path.read_text().strip() or None, str(path)
    except OSError:
        return None, f"{path} (none there)"


def check_auth(target: RayTarget, environ: Mapping[str, str] = os.environ,
               timeout_s: float = AUTH_PROBE_S) -> None:
    """Before ``ray.init``: does the cluster accept the token this client will send (or its lack)? A refusal is
    a ConfigError naming the address and the fix (exit 2, within seconds): ``ray.init`` would print ~20 s of
    ``InvalidAuthToken`` lines and end in a bare ConnectionError. No verdict (Ray Client, a slow or odd GCS):
    ``ray.init`` goes ahead under its own bound. Feature ``auth_probe`` (compat/features.py); without it, ray.init's
    own error within ``failure.connect_timeout_s``."""
    from elastic_train.compat import features
    from elastic_train.compat.ray_core import gcs_refuses_token

    if target.embedded or "://" in target.address or not features.enabled("auth_probe"):
        return
    token, where = client_token(environ, automatic=target.via_file)
    refused = gcs_refuses_token(target.address, token, timeout_s)
    name = target.source or "address"
    if refused is False and token is not None and gcs_refuses_token(target.address, None, timeout_s) is False:
        # The head has token auth off. ray.init would connect, but this driver's own gRPC server would then demand
        # the token from the cluster's processes, which send none: its actors are cancelled (exit 1, seen).
        how = ("unset RAY_AUTH_MODE" if environ.get("RAY_AUTH_MODE") else
               f"export RAY_AUTH_MODE=disabled (Ray sends the token it finds in {where} to a head it finds itself)")
        raise ConfigError(name, target.address, f"this Ray cluster has token authentication off and this client "
                          f"sends a token ({where}): {how}, or start the head with token auth "
                          "(cluster/local/start-head.sh)")
    if not refused:
        return
    if token is None:
        raise ConfigError(name, target.address, "this Ray cluster has token authentication on and this client sends "
                          f"no token ({where}): export RAY_AUTH_MODE=token, with the head's token (its "
                          "~/.ray/auth_token) in $RAY_AUTH_TOKEN or ~/.ray/auth_token")
    raise ConfigError(name, target.address, f"this Ray cluster refused the token from {where}: use the head's "
                      "token (its ~/.ray/auth_token)")


def _default(timeout_s: float, environ: Mapping[str, str]) -> RayTarget:
    path = cluster_file(environ)
    recorded = _read(path)
    if recorded is None:
        return RayTarget("local", EMBEDDED)
    why = probe(recorded, min(STALE_PROBE_S, timeout_s))
    if why is None:
        return RayTarget(recorded, "local head (ray start)", str(path), via_file=True)
    return RayTarget("local", EMBEDDED, warning=(
        f"{path} names a Ray head at {recorded} that does not answer ({why}): a stale leftover of a `ray start`; "
        "starting an embedded Ray instead (`ray stop` removes the file; --address chooses a cluster)"
    ))


def _read(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


LOOPBACK = ("127.", "localhost", "::1")


def job_processes_env(target: RayTarget, node_ip: Callable[[], str], *, starts_cleaner: bool = True,
                      environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``RAY_ADDRESS`` for the processes of this job on a cluster (``ray.init(runtime_env={"env_vars": ...})``),
    when they need it: the cluster's GCS, as every node reaches it (a loopback address, which named it from this
    node, becomes ``node_ip()``). Ray Train's ``PlacementGroupCleaner`` asks the state API for "the" local cluster
    without an address: the last ``ray start`` head on its host (``ray_current_cluster``), which with two Ray
    instances on a host may be another cluster; not finding the run's controller there, it removed the live run's
    placement group. Ray's public ``RAY_ADDRESS`` makes it ask this cluster.

    Empty (no job runtime env) when nothing needs it: an address without a port, a job that starts no cleaner
    (``starts_cleaner=False``: a sweep whose reaper replaces them), or a node whose ``ray_current_cluster`` names
    this cluster already (a ``ray start`` head, the usual case). A job runtime env is not free: every worker process
    of the job (each Tune trial actor, Train controller and worker) is then started for it through Ray's runtime-env
    agent and none of Ray's idle workers serves it (measured: a 6-trial sweep's trial from 6.6 to 10.2 s)."""
    parsed = host_port(target.address)
    if parsed is None or not starts_cleaner:
        return {}
    def as_every_node_sees(hp: tuple[str, int]) -> tuple[str, int]:  # loopback named it from this node
        return (node_ip() if hp[0].startswith(LOOPBACK) else hp[0], hp[1])

    host, port = as_every_node_sees(parsed)
    recorded = host_port(_read(cluster_file(environ)) or "")
    if recorded is not None and as_every_node_sees(recorded) == (host, port):
        return {}
    return {"RAY_ADDRESS": f"[{host}]:{port}" if ":" in host else f"{host}:{port}"}


def bounded(call: Callable[[], object], timeout_s: float, field: str, value: str) -> None:
    """Run ``call`` (``ray.init`` to an existing cluster) on a helper thread; if it has not returned within
    ``timeout_s``, raise ConfigError naming ``field`` = ``value``. Its exceptions are re-raised here.

    Something that accepts TCP but is no Ray head (or a head whose GCS is wedged) makes ``ray.init`` retry
    forever; the daemon thread is left behind and the job exits 2."""
    box: dict[str, BaseException] = {}

    def run() -> None:
        try:
            call()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="ray-connect", daemon=True)
    with _quiet_thread_warning():
        thread.start()
        thread.join(timeout_s)
    if thread.is_alive():
        raise ConfigError(field, value, f"something answers there, but Ray did not connect within {timeout_s:g}s "
                                        "(not a Ray head, or its GCS is wedged; failure.connect_timeout_s sets "
                                        "the wait)")
    if "error" in box:
        raise box["error"]


class _NotMainThreadFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "not the main thread" not in record.getMessage()


class _quiet_thread_warning:
    """Drop Ray's "SIGTERM handler is not set because current thread is not the main thread" while connecting:
    the job's own SIGTERM handler (jobs._cli.guarded) stays, which is what we want. The filter sits on the handlers
    of Ray's public ``ray`` logger, where the message of its (private) worker module's logger ends up."""

    def __enter__(self) -> None:
        import ray  # noqa: F401  (configures the ``ray`` logger's handlers)

        self.handlers = list(logging.getLogger("ray").handlers)
        self.filter = _NotMainThreadFilter()
        for handler in self.handlers:
            handler.addFilter(self.filter)

    def __exit__(self, *exc: object) -> None:
        for handler in self.handlers:
            handler.removeFilter(self.filter)
