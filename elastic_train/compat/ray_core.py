"""Ray Core internals (checked on Ray 2.60.0): the GCS tables, its kill call, the forwarded-output dispatcher
and the names of Ray's driver-side loggers we filter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# Loggers named by module (their modules are private); tests/unit/test_compat.py checks the modules exist.
AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"  # "Token authentication is enabled..."
WORKER_LOGGER = "ray._private.worker"  # "SIGTERM handler is not set because current thread is not the main..."


def placement_group_records() -> Iterator[bytes]:
    """The GCS's placement-group table, serialized ``PlacementGroupTableData`` records.

    ``ray.util.state.list_placement_groups`` would do, but it needs the dashboard's state API and, with a second
    Ray on the machine, asks for "the" cluster without an address (it fails); the GCS accessor does not."""
    from ray._private.state import state

    yield from state._connect_and_get_accessor().get_placement_group_table()


def actor_table() -> list[Any]:
    """The GCS's actor table, parsed (``ActorTableData`` records; same reason as above): one fetch that several
    scans can share."""
    from ray._private.state import state
    from ray.core.generated import gcs_pb2

    raws = state._connect_and_get_accessor().get_actor_table(None, None)
    return [gcs_pb2.ActorTableData.FromString(raw) for raw in raws]


def gcs_channel(address: str) -> Any:
    """A gRPC channel to the GCS at ``address``, as Ray's own clients open it (for ``KillActorViaGcs``: killing an
    actor this process holds no handle to; ``ray.kill`` needs one)."""
    from ray._private.grpc_utils import init_grpc_channel

    return init_grpc_channel(address)


# The GCS's cheapest call (an empty request), asked before ``ray.init`` to learn whether the cluster accepts this
# client's token: ray.init against a token-auth head without one prints ~20 s of C++ ``InvalidAuthToken`` lines and
# then raises a bare ConnectionError (issue 34 item 1). Ray's clients send the token as gRPC metadata
# ``authorization: Bearer <token>`` (ray/_private/authentication/authentication_constants.py).
CLUSTER_ID_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
AUTH_METADATA = "authorization"


def gcs_refuses_token(address: str, token: str | None, timeout_s: float) -> bool | None:
    """Whether the GCS at ``address`` (``host:port``) refuses a client sending ``token`` (None: none) as
    unauthenticated: True refused, False answered, None no verdict (unreachable, slow, any other error; ray.init
    then meets it with its own bound)."""
    import grpc

    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(CLUSTER_ID_METHOD, request_serializer=lambda _: b"",
                                   response_deserializer=lambda raw: raw)
        try:
            call(None, timeout=timeout_s,
                 metadata=((AUTH_METADATA, f"Bearer {token}"),) if token else None)
            return False
        except grpc.RpcError as e:
            return True if e.code() == grpc.StatusCode.UNAUTHENTICATED else None


def stdstream_dispatcher() -> Any:
    """Ray's dispatcher of worker output forwarded to the driver (``ray.init(log_to_driver=True)`` registers its
    printer there as ``"ray_print_logs"``, in ``handlers`` under ``_lock``). Ray has no public per-line filter
    (``RAY_DEDUP_LOGS_SKIP_REGEX`` is read once at ``import ray`` and is off with ``RAY_DEDUP_LOGS=0``)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher

    return global_worker_stdstream_dispatcher


def wrap_raylet_message_printer(wrap: Any) -> bool:
    """Replace Ray's driver-side printer of what raylets push to every driver with ``wrap(printer)``; True when
    it is wrapped. Ray's ``listen_error_messages`` thread calls the module-level ``print_to_stdstream`` by name
    (``pid="raylet"``), not through the stdstream dispatcher, so the forwarded-line filter never sees those lines.
    Idempotent; the wrapper gets ``(data, ignore_prefix)`` as Ray's function does."""
    import ray._private.worker as ray_worker

    current = ray_worker.print_to_stdstream
    if getattr(current, "elastic_train_wrapped", False):
        return True
    wrapped = wrap(current)
    wrapped.elastic_train_wrapped = True
    ray_worker.print_to_stdstream = wrapped
    return True


# ---- The GCS's key-value store (train/ledger.py, launch/reservations.py) ------------------------------------
# Ray's libraries keep small cluster-wide state there (Tune, Serve, runtime envs). The public face,
# ``ray.experimental.internal_kv._internal_kv_put`` and friends, takes no timeout; the client under it does.


def kv_put(key: bytes, value: bytes, namespace: bytes, timeout_s: float) -> None:
    """Store ``value`` under ``key`` (overwriting). Raises on a GCS that does not answer within ``timeout_s``."""
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    internal_kv_get_gcs_client().internal_kv_put(key, value, True, namespace, timeout=timeout_s)


def kv_get(key: bytes, namespace: bytes, timeout_s: float) -> bytes | None:
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    return internal_kv_get_gcs_client().internal_kv_get(key, namespace, timeout=timeout_s)


def kv_delete_prefix(prefix: bytes, namespace: bytes, timeout_s: float) -> None:
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    internal_kv_get_gcs_client().internal_kv_del(prefix, True, namespace, timeout=timeout_s)


def kv_keys(prefix: bytes, namespace: bytes, timeout_s: float) -> list[bytes]:
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    return internal_kv_get_gcs_client().internal_kv_keys(prefix, namespace, timeout=timeout_s)


# ---- Warm spare worker processes (train/spares.py) ------------------------------------------------------------
# Ray's runtime-env key for a worker process's setup hook. ``ray.init(runtime_env={"worker_process_setup_hook":
# "mod.fn"})`` sets it for every process of a job; Ray has no per-actor hook, so the Train workers' own
# ``env_vars`` carry it (a string hook is only this variable: ray/_private/runtime_env/setup_hook.py).
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
PRESTART_METHOD = "/ray.rpc.NodeManagerService/PrestartWorkers"


def prestart_workers(raylet_address: str, job_id_hex: str, serialized_runtime_env: str, count: int,
                     keep_alive_s: int, timeout_s: float) -> None:
    """Ask the raylet at ``raylet_address`` to start ``count`` idle worker processes of this job with exactly
    ``serialized_runtime_env`` (a Train worker's own: the raylet hands an idle process to an actor only when
    the hash of its runtime env is the same), kept alive ``keep_alive_s`` even when idle. Ray uses this RPC for
    its own prestarts; the core worker's ``PrestartWorkers`` has no Python binding. Raises grpc.RpcError."""
    import json

    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import common_pb2, node_manager_pb2, runtime_environment_pb2

    env = json.loads(serialized_runtime_env or "{}")
    uris = runtime_environment_pb2.RuntimeEnvUris(
        working_dir_uri=env.get("working_dir", "") if isinstance(env.get("working_dir"), str) else "",
        py_modules_uris=[m for m in env.get("py_modules", []) if isinstance(m, str)])
    request = node_manager_pb2.PrestartWorkersRequest(
        language=common_pb2.Language.PYTHON, job_id=bytes.fromhex(job_id_hex),
        runtime_env_info=runtime_environment_pb2.RuntimeEnvInfo(serialized_runtime_env=serialized_runtime_env,
                                                                uris=uris),
        keep_alive_duration_secs=int(keep_alive_s), num_workers=int(count))
    channel = init_grpc_channel(raylet_address)
    try:
        call = channel.unary_unary(PRESTART_METHOD, request_serializer=lambda m: m.SerializeToString(),
                                   response_deserializer=node_manager_pb2.PrestartWorkersReply.FromString)
        call(request, timeout=timeout_s)
    finally:
        channel.close()
