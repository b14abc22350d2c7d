"""Ray Core internals, each serving a feature of :mod:`.features` (registry.py lists every name used here).

Nothing private is imported at this module's import: a Ray release without one of them fails only the feature
that needs it, which :func:`~elastic_train.compat.features.enabled` has already turned off.
"""

from __future__ import annotations

from typing import Any

from elastic_train.compat.features import note_entries

# ---- sweep_reaper: the GCS's tables, read without the dashboard (sweep/placement_groups.py) ------------------
# ``ray.util.state`` would do, but it needs the dashboard's state API and, with a second Ray on the machine, asks
# for "the" cluster without an address (it fails); the GCS accessor does neither.

LIVE_GROUP_STATES = ("PENDING", "PREPARED", "CREATED", "RESCHEDULING")


def _accessor() -> Any:
    from ray._private.state import state

    return state._connect_and_get_accessor()


# The class names Ray Train's actors carry in the GCS's actor table (ray/train/v2/_internal/execution/controller/).
TRAIN_CONTROLLER = "TrainController"
PG_CLEANER = "PlacementGroupCleaner"


def gcs_actors(job_id_hex: str, state: str, class_name: str) -> list[dict[str, str]]:
    """``job_id_hex``'s actors of class ``class_name`` in ``state`` (``ALIVE``, ``DEAD``) from the GCS's actor table,
    as ``{"id", "worker", "owner_worker"}`` (hex): the GCS filters by job and state itself, so a scan costs what this
    job holds, however many actors other jobs left in the table."""
    import ray
    from ray.core.generated import gcs_pb2

    feature = "sweep_reaper" if class_name == PG_CLEANER else "trial_reuse"
    note_entries(feature, "_connect_and_get_accessor", "get_actor_table", "ActorTableData", f":{class_name}")
    out = []
    for raw in _accessor().get_actor_table(ray.JobID(bytes.fromhex(job_id_hex)), state):
        a = gcs_pb2.ActorTableData.FromString(raw)
        if a.class_name == class_name:
            out.append({"id": a.actor_id.hex(), "worker": a.address.worker_id.hex(),
                        "owner_worker": a.owner_address.worker_id.hex()})
    return out


def actor_alive(actor_id_hex: str) -> bool:
    """Whether the actor ``actor_id_hex`` (of any job) is alive or restarting, from its own GCS record (one
    lookup: the cost of a check is one record, not the table). A record the GCS no longer holds: not alive."""
    import ray
    from ray.core.generated import gcs_pb2

    note_entries("dead_run_requests", "_connect_and_get_accessor", "get_actor_info", "ActorTableData")
    raw = _accessor().get_actor_info(ray.ActorID(bytes.fromhex(actor_id_hex)))
    if raw is None:
        return False
    return gcs_pb2.ActorTableData.FromString(raw).state != gcs_pb2.ActorTableData.DEAD


def live_actor_created_groups(job_id_hex: str) -> list[dict[str, Any]]:
    """``job_id_hex``'s live placement groups that an actor created (Train runs' worker groups; Tune's trial groups
    are the driver's): ``{"id", "detached", "creator_dead"}`` each."""
    import ray
    from ray.core.generated import gcs_pb2

    note_entries("sweep_reaper", "_connect_and_get_accessor", "get_placement_group_table", "PlacementGroupTableData")
    names = gcs_pb2.PlacementGroupTableData.PlacementGroupState.Name
    out = []
    for raw in _accessor().get_placement_group_table():
        pg = gcs_pb2.PlacementGroupTableData.FromString(raw)
        if names(pg.state) in LIVE_GROUP_STATES and pg.creator_job_id.hex() == job_id_hex and pg.creator_actor_id \
                and not ray.ActorID(pg.creator_actor_id).is_nil():
            out.append({"id": pg.placement_group_id.hex(), "detached": pg.is_detached,
                        "creator_dead": pg.creator_actor_dead})
    return out


def kill_actors(gcs_address: str, actor_ids: list[str], timeout_s: float = 10.0) -> int:
    """End the actors ``actor_ids`` as ``ray.kill`` does (no restart), without a handle: the GCS's kill call takes
    the id (a stranded PlacementGroupCleaner, a stopped trial's Train controller: unnamed, no handle here)."""
    if not actor_ids:
        return 0
    note_entries("sweep_reaper", "KillActorViaGcs", "init_grpc_channel")
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = init_grpc_channel(gcs_address)
    try:
        actors = gcs_service_pb2_grpc.ActorInfoGcsServiceStub(channel)
        for actor_id in actor_ids:
            actors.KillActorViaGcs(gcs_service_pb2.KillActorViaGcsRequest(
                actor_id=bytes.fromhex(actor_id), force_kill=True, no_restart=True), timeout=timeout_s)
    finally:
        channel.close()
    return len(actor_ids)


# ---- auth_probe: the GCS's cheapest call before ``ray.init`` (launch/reach.py) ---------------------------------
# ray.init against a token-auth head without the token prints ~20 s of C++ ``InvalidAuthToken`` lines and then
# raises a bare ConnectionError. Ray's clients send the token as gRPC metadata ``authorization: Bearer <token>``
# (ray/_private/authentication/authentication_constants.py).
CLUSTER_ID_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
AUTH_METADATA = "authorization"


def gcs_refuses_token(address: str, token: str | None, timeout_s: float) -> bool | None:
    """Whether the GCS at ``address`` (``host:port``) refuses a client sending ``token`` (None: none) as
    unauthenticated: True refused, False answered, None no verdict (unreachable, slow, any other error; ray.init
    then meets it with its own bound)."""
    import grpc

    note_entries("auth_probe", "GetClusterId", "AUTHORIZATION_HEADER_NAME", "AUTHORIZATION_BEARER_PREFIX")
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(CLUSTER_ID_METHOD, request_serializer=lambda _: b"",
                                   response_deserializer=lambda raw: raw)
        try:
            call(None, timeout=timeout_s,
                 metadata=((AUTH_METADATA, f"Bearer {token}"),) if token else None)
            return False
        except grpc.RpcError as e:
            return True if e.code() == grpc.StatusCode.UNAUTHENTICATED else None


# ---- console_blocks: Ray's printers of forwarded output (launch/quiet.py) ---------------------------------------


def stdstream_dispatcher() -> Any:
    """Ray's dispatcher of worker output forwarded to the driver (``ray.init(log_to_driver=True)`` registers its
    printer there as ``"ray_print_logs"``, in ``handlers`` under ``_lock``)."""
    from ray._private.ray_logging import global_worker_stdstream_dispatcher

    note_entries("console_blocks", "global_worker_stdstream_dispatcher", "#handlers", "#_lock")
    return global_worker_stdstream_dispatcher


def wrap_raylet_message_printer(wrap: Any) -> bool:
    """Replace Ray's driver-side printer of what raylets push to every driver with ``wrap(printer)``; True when
    it is wrapped. Ray's ``listen_error_messages`` thread calls the module-level ``print_to_stdstream`` by name
    (``pid="raylet"``), not through the stdstream dispatcher. Idempotent; the wrapper gets ``(data,
    ignore_prefix)`` as Ray's function does."""
    import ray._private.worker as ray_worker

    note_entries("console_blocks", "print_to_stdstream")
    current = ray_worker.print_to_stdstream
    if getattr(current, "elastic_train_wrapped", False):
        return True
    wrapped = wrap(current)
    wrapped.elastic_train_wrapped = True
    ray_worker.print_to_stdstream = wrapped
    return True


# ---- dead_run_requests: the GCS's key-value store (launch/reservations.py) ----------------------------------
# Ray's libraries keep small cluster-wide state there (Tune, Serve, runtime envs). The public face,
# ``ray.experimental.internal_kv._internal_kv_put`` and friends, takes no timeout; the client under it does.


def kv_put(key: bytes, value: bytes, namespace: bytes, timeout_s: float) -> None:
    """Store ``value`` under ``key`` (overwriting). Raises on a GCS that does not answer within ``timeout_s``."""
    note_entries("dead_run_requests", "internal_kv_get_gcs_client", "internal_kv_put")
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    internal_kv_get_gcs_client().internal_kv_put(key, value, overwrite=True, namespace=namespace, timeout=timeout_s)


def kv_get(key: bytes, namespace: bytes, timeout_s: float) -> bytes | None:
    note_entries("dead_run_requests", "internal_kv_get_gcs_client", "internal_kv_get")
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    return internal_kv_get_gcs_client().internal_kv_get(key, namespace=namespace, timeout=timeout_s)


def kv_delete_prefix(prefix: bytes, namespace: bytes, timeout_s: float) -> None:
    note_entries("dead_run_requests", "internal_kv_get_gcs_client", "internal_kv_del")
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    internal_kv_get_gcs_client().internal_kv_del(prefix, del_by_prefix=True, namespace=namespace, timeout=timeout_s)


def kv_keys(prefix: bytes, namespace: bytes, timeout_s: float) -> list[bytes]:
    note_entries("dead_run_requests", "internal_kv_get_gcs_client", "internal_kv_keys")
    from ray.experimental.internal_kv import internal_kv_get_gcs_client

    return internal_kv_get_gcs_client().internal_kv_keys(prefix, namespace=namespace, timeout=timeout_s)


# ---- warm_spares: idle worker processes made with a Train worker's runtime env (train/spares.py) ----------------
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
    from ray.core.generated import node_manager_pb2, runtime_environment_pb2

    note_entries("warm_spares", "PrestartWorkers", "RuntimeEnvInfo", "RuntimeEnvUris", "init_grpc_channel")

    env = json.loads(serialized_runtime_env or "{}")
    uris = runtime_environment_pb2.RuntimeEnvUris(
        working_dir_uri=env.get("working_dir", "") if isinstance(env.get("working_dir"), str) else "",
        py_modules_uris=[m for m in env.get("py_modules", []) if isinstance(m, str)])
    request = node_manager_pb2.PrestartWorkersRequest(  # language: PYTHON, the enum's default (0)
        job_id=bytes.fromhex(job_id_hex),
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
