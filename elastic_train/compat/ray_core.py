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


def actor_records() -> Iterator[bytes]:
    """The GCS's actor table, serialized ``ActorTableData`` records (same reason as above)."""
    from ray._private.state import state

    yield from state._connect_and_get_accessor().get_actor_table(None, None)


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
