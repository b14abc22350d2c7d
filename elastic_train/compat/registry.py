"""The list of every upstream internal the code relies on, and the check that each is still there.

Each :class:`Entry` names the thing (``module:qualname``), what kind of reliance it is, where we use it, what
for, the upstream issue or the reason, and the version it was checked on. :func:`problem` says what is wrong
with one entry under the installed versions (None: still as expected); ``tests/unit/test_compat.py`` runs it
over :data:`ENTRIES`. Kinds:

* ``attr``: a private module attribute (class, function, constant); ``params``: its signature's parameter names.
* ``override``: a private method our subclass ``ours`` overrides (or calls on ``super()``): it must exist
  upstream with ``params``, and ours must take the same parameters. A rename would leave ours never called.
* ``member``: a private attribute read or set on instances (``scheduler._last_lr``): the class's source must
  still assign it.
* ``env``: an environment knob; ``target`` is the upstream constant naming it, ``value`` the name we set.
* ``literal``: an environment variable upstream reads under a literal name (no constant names it): the source
  of ``target``, the function that reads it, must still hold ``"value"``.
* ``calls``: a private function whose source must still call ``value`` by its module-level name (we replace
  that name, so a call through anything else would bypass ours).
* ``const``: a private constant whose value we rely on (``value``).
* ``grpc``: a gRPC method we call by its path; ``target`` is the generated module, ``value`` ``package.Service.Method``.
* ``fields``: a generated protobuf message we build; ``value``: the comma-separated fields we set.
* ``mirror``: upstream code we copy a part of (``value``: the first 16 hex digits of the sha256 of its source):
  any change upstream, however small, fails the canary until the copy is checked against it again.
* ``module``: a private module we import, or whose logger (named by it) we quiet or filter: it must exist.
* ``ours``: our own process-level trick (a niceness change, a process-wide environment default, an exit
  without interpreter teardown): ``target`` is ``path::text`` and the file must still hold that text, so the
  list stays honest when the code moves.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RAY, MLFLOW, TORCH = "ray 2.60.0", "mlflow 3.17.2", "torch 2.13.0"
ROOT = Path(__file__).resolve().parents[2]
_TRAIN = "ray.train.v2._internal.execution"
_POLICY = f"{_TRAIN}.scaling_policy.elastic:ElasticScalingPolicy"
_CLIENT = f"{_TRAIN}.scaling_policy.autoscaling_coordinator_client:TrainAutoscalingCoordinatorClient"
_COORD = "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator"


@dataclass(frozen=True)
class Entry:
    target: str
    kind: str
    used_in: str
    purpose: str
    why: str  # the upstream issue, or why no public API does it
    checked_on: str
    params: tuple[str, ...] | None = None
    ours: str | None = None  # override: our subclass (module:Class)
    value: str | None = None  # env: the variable's name as we set it; member: the attribute name


NO_PUBLIC = "no public API in Ray Train V2 (only UserCallback is public)"
_NO_TORCH = ("the Train controller's process imports torch only to unpickle TorchConfig (~1.6 s per run, per "
             "trial); no public backend config without it")

ENTRIES: tuple[Entry, ...] = (
    # ---- Ray Core: the GCS's auth check before ray.init (compat/ray_core.py)
    Entry("ray.core.generated.gcs_service_pb2", "grpc", "launch/reach.py (compat.ray_core.gcs_refuses_token)",
          "ask the GCS whether it accepts this client's token, before ray.init", "ray.init prints ~20 s of "
          "InvalidAuthToken lines, then a bare ConnectionError (issue 34 item 1)", RAY,
          value="ray.rpc.NodeInfoGcsService.GetClusterId"),
    Entry("ray._private.authentication.authentication_constants:AUTHORIZATION_HEADER_NAME", "const",
          "compat/ray_core.py (AUTH_METADATA)", "the gRPC metadata key Ray's clients send the token in",
          "the probe sends the token as Ray does", RAY, value="authorization"),
    Entry("ray._private.authentication.authentication_constants:AUTHORIZATION_BEARER_PREFIX", "const",
          "compat/ray_core.py (gcs_refuses_token)", "the token's prefix in that header", "as above", RAY,
          value="Bearer "),
    # ---- Ray Train: callback bases (compat/ray_train.py)
    Entry(f"{_TRAIN}.callback:ControllerCallback", "attr", "launch/controller.py, tracking/checkpoints.py",
          "controller hooks: niceness, a fresh cluster view on failure, restart markers, the end-of-run flush",
          NO_PUBLIC, RAY),
    Entry(f"{_TRAIN}.callback:ControllerCallback.after_controller_start", "attr", "launch/controller.py",
          "the controller's start hook", NO_PUBLIC, RAY, params=("self", "train_run_context")),
    Entry(f"{_TRAIN}.callback:WorkerGroupCallback", "attr", "launch/controller.py, tracking/checkpoints.py",
          "worker-group start/shutdown hooks", NO_PUBLIC, RAY),
    Entry(f"{_TRAIN}.callback:ReportCallback", "attr", "tracking/checkpoints.py",
          "each report's checkpoint, logged to MLflow from the controller", NO_PUBLIC, RAY),
    Entry(f"{_TRAIN}.callback:WorkerCallback", "attr", "train/warmup.py",
          "in each worker before the training function: warm imports, gloo's interface", NO_PUBLIC, RAY),
    Entry(f"{_TRAIN}.callback:WorkerCallback.after_init_train_context", "attr", "train/warmup.py",
          "the worker hook WorkerWarmup overrides", NO_PUBLIC, RAY, params=("self",)),
    # ---- Ray Train: context, trainer override, elastic policy
    Entry(f"{_TRAIN}.context:get_train_context", "attr", "train/worker.py (compat.ray_train.train_run_id)",
          "Ray Train's run id in a worker (reservations keyed by it)", "no public run id in 2.60", RAY, params=()),
    Entry(f"{_TRAIN}.context:TrainRunContext", "member", "compat.ray_train.train_run_id",
          "the run id on the train run context", "no public run id in 2.60", RAY, value="run_id"),
    Entry("ray.train.torch:TorchTrainer._initialize_and_run_controller", "override", "launch/trainer.py",
          "hand the controller another scaling policy (a sweep trial's floor and extra)",
          "ScalingConfig has no scaling-policy field; the policy is built in the driver", RAY,
          params=("self", "controller_init_kwargs"), ours="elastic_train.launch.trainer:_Trainer"),
    Entry("ray.train.torch:TorchTrainer._create_default_callbacks", "override", "launch/trainer.py",
          "Ray Train's callbacks with fewer helper processes (no DatasetManager without datasets, no "
          "PlacementGroupCleaner in sweep trials)",
          "no public way to leave out a default callback", RAY, params=("self",),
          ours="elastic_train.launch.trainer:_Trainer"),
    Entry("ray.train.torch:TorchTrainer", "member", "launch/trainer.py", "passed to our DatasetsCallback",
          "as above", RAY, value="train_run_context"),
    Entry("ray.train.torch:TorchTrainer", "member", "launch/trainer.py", "passed to our DatasetsCallback",
          "as above", RAY, value="datasets"),
    Entry("ray.train.v2._internal.callbacks.datasets:DatasetsCallback", "attr",
          "launch/controller.py (compat.ray_train)", "the callback DatasetsWithoutManager replaces", "as above", RAY,
          params=("train_run_context", "datasets")),
    Entry("ray.train.v2._internal.callbacks.datasets:DatasetsCallback.before_init_train_context", "override",
          "launch/controller.py", "no DatasetManager actor when the trainer has no datasets", "as above", RAY,
          params=("self", "workers"), ours="elastic_train.launch.controller:DatasetsWithoutManager"),
    Entry(f"{_TRAIN}.scaling_policy.scaling_policy:ScalingPolicy.after_controller_start", "literal",
          "sweep/stops.py (compat.ray_train.train_run_requester)",
          "a stopped trial's killed Train run: its resource request cancelled at once",
          "a killed controller never cancels it: the coordinator keeps it 180 s and elastic runs cannot grow", RAY,
          value="train-{train_run_context.run_id}"),
    Entry("ray.train.v2._internal.callbacks.placement_group_callback:PlacementGroupCleanerCallback", "attr",
          "launch/controller.py (compat.ray_train)", "left out of a sweep trial's callbacks (the sweep reaps)",
          "as above", RAY),
    Entry("ray.train.v2._internal.callbacks.datasets:DatasetsCallback", "member", "launch/controller.py",
          "read by our before_init_train_context", "as above", RAY, value="_datasets"),
    Entry("ray.train.v2._internal.callbacks.datasets:DatasetsCallback", "member", "launch/controller.py",
          "set by our before_init_train_context (None: nothing to shut down)", "as above", RAY,
          value="_dataset_shard_provider"),
    Entry(f"{_POLICY}._get_num_workers_for_resource_request", "override", "sweep/elastic.py",
          "a trial asks only for what it may grow by", "sweep/elastic.py docstring: stock Ray does not grow a trial",
          RAY, params=("self",), ours="elastic_train.sweep.elastic:TrialScalingPolicy"),
    Entry(f"{_POLICY}._count_possible_workers", "override", "sweep/elastic.py",
          "a trial's size: its floor plus the extra reserved to it", "as above", RAY,
          params=("self", "reserved_resources"), ours="elastic_train.sweep.elastic:TrialScalingPolicy"),
    Entry(f"{_POLICY}.after_controller_start", "override", "sweep/elastic.py",
          "the trial's own requester id and client", "as above", RAY, params=("self", "train_run_context"),
          ours="elastic_train.sweep.elastic:TrialScalingPolicy"),
    Entry(f"{_POLICY}._send_resource_request", "attr", "sweep/elastic.py", "called by our after_controller_start",
          "as above", RAY, params=("self",)),
    Entry(_POLICY, "member", "sweep/elastic.py", "set by our after_controller_start", "as above", RAY,
          value="_requester_id"),
    Entry(_POLICY, "member", "sweep/elastic.py", "set by our after_controller_start", "as above", RAY,
          value="_coordinator_client"),
    Entry(f"{_CLIENT}.send_resource_request", "override", "sweep/elastic.py",
          "the same request at MEDIUM priority (growth after every floor)", "as above", RAY,
          params=("self", "scaling_config", "num_workers"), ours="elastic_train.sweep.elastic:_ExtraClient"),
    Entry(_CLIENT, "member", "sweep/elastic.py", "read by our send_resource_request", "as above", RAY,
          value="_autoscaling_coordinator"),
    Entry(_CLIENT, "member", "sweep/elastic.py", "read by our send_resource_request", "as above", RAY,
          value="_requester_id"),
    Entry(_CLIENT, "member", "sweep/elastic.py", "set by our send_resource_request", "as above", RAY,
          value="_latest_autoscaling_request_time"),
    Entry(f"{_TRAIN}.scaling_policy.autoscaling_coordinator_client:AUTOSCALING_REQUESTS_EXPIRE_TIME_S", "attr",
          "sweep/elastic.py", "a floor's expiry (re-sent before it)", "as above", RAY),
    Entry(f"{_TRAIN}.scaling_policy.autoscaling_coordinator_client:AUTOSCALING_REQUESTS_GET_TIMEOUT_S", "attr",
          "sweep/elastic.py", "the request's timeout, as Ray's own client", "as above", RAY),
    Entry(f"{_COORD}:get_or_create_autoscaling_coordinator", "attr", "sweep/elastic.py",
          "the cluster-wide coordinator the floors are registered with", "as above", RAY, params=()),
    Entry(f"{_COORD}:_AutoscalingCoordinatorActor.request_resources", "attr", "sweep/elastic.py",
          "a trial's floor, called by keyword on the actor", "as above", RAY,
          params=("self", "requester_id", "resources", "expire_after_s", "request_remaining", "priority",
                  "label_selectors", "subcluster_selector", "strategy")),
    Entry(f"{_COORD}:_AutoscalingCoordinatorActor.cancel_request", "attr",
          "compat/ray_train.py (cancel_resource_requests)", "a stopped trial's floor, extra and Train run request",
          "as above", RAY, params=("self", "requester_id")),
    Entry(f"{_COORD}:ResourceRequestPriority", "member", "sweep/elastic.py", "HIGH for floors", "as above", RAY,
          value="HIGH"),
    Entry(f"{_COORD}:ResourceRequestPriority", "member", "sweep/elastic.py", "MEDIUM for growth", "as above", RAY,
          value="MEDIUM"),
    Entry("ray.train._internal.autoscaling_coordinator_client:build_train_resource_request", "attr",
          "sweep/elastic.py", "the request body, as Ray Train builds it", "as above", RAY,
          params=("scaling_config", "num_workers")),
    # ---- Ray Train: the torch backend's controller half without torch (compat/torch_backend.py)
    Entry("ray.train.torch.config:_TorchBackend", "mirror", "compat/torch_backend.py (_LightTorchBackend)",
          "its controller half for gloo / nccl over env:// (on_start, on_shutdown, on_training_start, "
          "share_cuda_visible_devices)", _NO_TORCH, RAY, value="8476765a740b96e3"),
    Entry("ray.train.torch.config:TorchConfig", "mirror", "compat/torch_backend.py (LightTorchConfig)",
          "the same fields, defaults, context and framework", _NO_TORCH, RAY, value="7666b34edd7a7e0d"),
    Entry("ray.train.torch.config:_setup_torch_process_group", "attr", "compat/torch_backend.py (in the worker)",
          "every rank's init_process_group", _NO_TORCH, RAY,
          params=("backend", "world_rank", "world_size", "init_method", "timeout_s")),
    Entry("ray.train.torch.config:_set_torch_distributed_env_vars", "attr", "compat/torch_backend.py (in the "
          "worker)", "RANK, LOCAL_RANK, WORLD_SIZE ... before the group forms", _NO_TORCH, RAY, params=()),
    Entry("ray.train.torch.config:_shutdown_torch", "attr", "compat/torch_backend.py (in the worker)",
          "the group destroyed at a worker group's end", _NO_TORCH, RAY, params=("destroy_process_group",)),
    Entry("ray.train.torch.config:TorchConfigContextManager", "attr", "compat/torch_backend.py (in the worker)",
          "the CUDA device set around the training function", _NO_TORCH, RAY),
    Entry("ray.train.v2._internal.util:TrainingFramework.TORCH", "attr", "compat/torch_backend.py",
          "the run's framework, as TorchConfig gives it (Ray's run state and dashboard)", _NO_TORCH, RAY),
    Entry("ray.train._internal.utils:get_address_and_port", "attr", "compat/torch_backend.py (on worker 0)",
          "the process group's master address", _NO_TORCH, RAY, params=()),
    # ---- Ray Train: environment knobs (ray/train/v2/_internal/constants.py)
    Entry("ray.train.v2._internal.constants:HEALTH_CHECK_INTERVAL_S_ENV_VAR", "env", "launch/trainer.py",
          "report() waits for the controller's poll: 2 s per checkpoint by default",
          "no RunConfig field (DESIGN: report only at checkpoint cadence)", RAY,
          value="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"),
    Entry("ray.train.v2._internal.constants:WORKER_GROUP_START_TIMEOUT_S_ENV_VAR", "env", "launch/trainer.py",
          "a restart after a node loss retries sooner", "no RunConfig field", RAY,
          value="RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"),
    Entry("ray.train.v2._internal.constants:ENABLE_PREEMPTION_WATCHER_ENV_VAR", "env", "launch/trainer.py",
          "no PreemptionWatcher process per worker group on an embedded (one-node) Ray",
          "no ScalingConfig or RunConfig field", RAY, value="RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"),
    # ---- Ray Train / Core: loggers we quiet or filter
    Entry("ray.train._internal.storage", "module", "sweep/relay.py",
          "\"Checkpoint successfully created at\" INFO per report, per trial", "healthy runs quiet", RAY),
    Entry(f"{_TRAIN}.context", "module", "train/worker.py (compat.ray_train.train_context_logger)",
          "INFO per report; this logger is named by the file's path", "healthy runs quiet", RAY),
    Entry("ray._private.authentication.authentication_token_setup", "module", "launch/quiet.py",
          "\"Token authentication is enabled\" WARNING on every embedded ray.init", "healthy runs quiet", RAY),
    Entry("ray._private.worker", "module", "launch/reach.py",
          "\"SIGTERM handler is not set\" when connecting off the main thread", "healthy runs quiet", RAY),
    # ---- Ray Core: the GCS's key-value store (compat/ray_core.py kv_*, train/ledger.py)
    Entry("ray.experimental.internal_kv:internal_kv_get_gcs_client", "attr", "train/ledger.py (compat.ray_core)",
          "the run's ledger (goodput book, final metrics) in the GCS: no actor process of its own",
          "internal_kv's underscored functions take no timeout (every wait bounded)", RAY, params=()),
    Entry("ray._raylet:InnerGcsClient.internal_kv_put", "attr", "train/ledger.py (compat.ray_core.kv_put)",
          "as above", "as above", RAY, params=("self", "key", "value", "overwrite", "namespace", "timeout")),
    Entry("ray._raylet:InnerGcsClient.internal_kv_get", "attr", "train/ledger.py (compat.ray_core.kv_get)",
          "as above", "as above", RAY, params=("self", "key", "namespace", "timeout")),
    Entry("ray._raylet:InnerGcsClient.internal_kv_del", "attr", "train/ledger.py (compat.ray_core.kv_delete_prefix)",
          "as above", "as above", RAY, params=("self", "key", "del_by_prefix", "namespace", "timeout")),
    Entry("ray._raylet:InnerGcsClient.internal_kv_keys", "attr", "launch/reservations.py (compat.ray_core.kv_keys)",
          "the Train runs whose controller may have died with a resource request open", "as above", RAY,
          params=("self", "prefix", "namespace", "timeout")),
    # ---- Ray Core (compat/ray_core.py)
    Entry("ray._private.ray_logging:global_worker_stdstream_dispatcher", "attr", "launch/quiet.py",
          "drop known-benign forwarded lines (ray-project/ray#53727 and others: launch/quiet.py)",
          "no public per-line filter (RAY_DEDUP_LOGS_SKIP_REGEX is off with RAY_DEDUP_LOGS=0)", RAY),
    Entry("ray._private.worker:print_to_stdstream", "attr", "launch/quiet.py (compat.ray_core)",
          "drop the raylet's startup-concurrency WARNING that every driver prints (issue 34 item 13)",
          "the raylet pushes it to every driver; no setting turns it off", RAY, params=("data", "ignore_prefix")),
    Entry("ray._private.worker:listen_error_messages", "calls", "compat/ray_core.py",
          "the thread that prints raylet messages calls print_to_stdstream by its module-level name",
          "a call through anything else would bypass the wrapper", RAY, value="print_to_stdstream"),
    Entry("ray._private.ray_logging:WorkerStandardStreamDispatcher", "member", "launch/quiet.py",
          "the handler list we wrap", "as above", RAY, value="handlers"),
    Entry("ray._private.ray_logging:WorkerStandardStreamDispatcher", "member", "launch/quiet.py",
          "its lock", "as above", RAY, value="_lock"),
    Entry("ray._private.state:GlobalState._connect_and_get_accessor", "attr", "sweep/placement_groups.py",
          "the GCS's placement-group and actor tables (a stopped trial's orphans: ray-project/ray#54305)",
          "ray.util.state needs the dashboard and fails with two Ray instances on a machine", RAY,
          params=("self",)),
    Entry("ray._private.grpc_utils:init_grpc_channel", "attr", "sweep/placement_groups.py",
          "KillActorViaGcs for a stranded PlacementGroupCleaner we hold no handle to",
          "ray.kill needs a handle", RAY, params=("address", "options", "asynchronous", "credentials")),
    # ---- Ray Core: warm spare worker processes (train/spares.py, compat/ray_core.py)
    Entry("ray.core.generated.node_manager_pb2", "grpc", "train/spares.py (compat.ray_core.prestart_workers)",
          "ask a node's raylet to prestart idle worker processes with a Train worker's runtime env",
          "the core worker's PrestartWorkers has no Python binding", RAY,
          value="ray.rpc.NodeManagerService.PrestartWorkers"),
    Entry("ray.core.generated.node_manager_pb2:PrestartWorkersRequest", "fields", "compat/ray_core.py",
          "the request we build (the keep-alive: a spare outlives Ray's 1 s idle reaping)", "as above", RAY,
          value="language,job_id,runtime_env_info,keep_alive_duration_secs,num_workers"),
    Entry("ray.core.generated.runtime_environment_pb2:RuntimeEnvInfo", "fields", "compat/ray_core.py",
          "the runtime env the spares are made with", "as above", RAY, value="serialized_runtime_env,uris"),
    Entry("ray._private.ray_constants:WORKER_PROCESS_SETUP_HOOK_ENV_VAR", "const", "train/spares.py "
          "(compat.ray_core.SETUP_HOOK_ENV)", "the Train workers' setup hook (it preloads torch in every spare)",
          "Ray has a job-wide worker_process_setup_hook only; a string hook is this variable", RAY,
          value="__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"),
    Entry("ray._private.runtime_env.setup_hook:load_and_execute_setup_hook_module", "attr",
          "train/spares.py", "a string hook is imported as module.function", "as above", RAY,
          params=("worker_process_setup_hook_key",)),
    # ---- Ray Data (compat/ray_data.py)
    Entry("ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer:FooterFileIndexer.__init__",
          "literal", "data/ray_source.py (compat.ray_data.parquet_footer_readers)",
          "a Parquet read of a few files lists them with one footer reader, not 32 new processes per execution",
          "no read_parquet argument sizes the footer-reader pool (32 actors for 4 files: ~20 s on 2 cores)", RAY,
          value="RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"),
    Entry("ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer:_DEFAULT_BATCH_SIZE", "const",
          "compat/ray_data.py (FOOTERS_PER_ACTOR)", "the files one footer-reader call reads",
          "sizes the pool to the file count", RAY, value=10),
    Entry("ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer:_DEFAULT_NUM_ACTORS", "const",
          "compat/ray_data.py (RAY_DEFAULT_FOOTER_ACTORS)", "the pool's size for a data set of 320 files or more",
          "Ray's own default kept as the ceiling", RAY, value=32),
    # ---- Ray Tune (compat/ray_tune.py)
    Entry("ray.tune.experimental.output:get_air_verbosity", "literal", "sweep/tuner.py (compat.ray_tune)",
          "Tune's start banner off (the old output engine is silent at verbose=0)",
          "the new engine prints its banner whatever the verbosity", RAY, value="RAY_AIR_NEW_OUTPUT"),
    Entry("ray.tune:ResultGrid", "member", "sweep/results.py", "each trial's status (stopped vs interrupted)",
          "no public accessor of the trials in 2.60", RAY, value="_experiment_analysis"),
    Entry("ray.tune.trainable.function_trainable:FunctionTrainable.reset_config", "literal",
          "sweep/stops.py (compat.ray_tune.allow_reset_wait)", "Tune waits for a stopped trial's function to "
          "return before it hands the process to the next trial", "read under a literal name", RAY,
          value="TUNE_FUNCTION_THREAD_TIMEOUT_S"),
    Entry("ray.train._internal.session:get_session", "attr", "sweep/stops.py (compat.ray_tune.trial_stop_event)",
          "the running trial's session in its Tune actor", "no public view of a trial's stop in the function API",
          RAY, params=()),
    Entry("ray.train._internal.session:_TrainSession", "member", "sweep/stops.py (compat.ray_tune.trial_stop_event)",
          "Tune sets it when it stops a trial or hands its actor to the next", "as above", RAY, value="stop_event"),
    # ---- MLflow (compat/mlflow.py)
    Entry("mlflow.tracking._tracking_service.utils:_use_tracking_uri", "attr", "tracking/models.py",
          "a tracking URI for one call, restoring the env var too", "set_tracking_uri exports the URI", MLFLOW,
          params=("uri",)),
    Entry("mlflow.environment_variables:MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "env", "compat/mlflow.py",
          "no \"Downloading artifacts\" bars on the console", "issue 34 item 7", MLFLOW,
          value="MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"),
    Entry("mlflow.environment_variables:MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "env", "compat/mlflow.py",
          "no \"View run ... at\" lines", "the summary prints the address once", MLFLOW,
          value="MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"),
    Entry("mlflow.environment_variables:MLFLOW_LOGGING_LEVEL", "env", "tracking/quiet.py",
          "MLflow's INFO lines off by default", "healthy runs quiet", MLFLOW, value="MLFLOW_LOGGING_LEVEL"),
    Entry("mlflow.environment_variables:MLFLOW_HTTP_REQUEST_MAX_RETRIES", "env", "tracking/mlflow_tracker.py",
          "a failed request fails fast (our sender retries)", "MLflow's backoff blocks for minutes", MLFLOW,
          value="MLFLOW_HTTP_REQUEST_MAX_RETRIES"),
    Entry("mlflow.environment_variables:MLFLOW_HTTP_REQUEST_TIMEOUT", "env", "tracking/mlflow_tracker.py",
          "bounded requests", "every wait bounded", MLFLOW, value="MLFLOW_HTTP_REQUEST_TIMEOUT"),
    # ---- torch (compat/torch.py)
    Entry("torch.export._trace", "module", "tracking/mlflow_backend.py (compat.torch.preload_torch_export)",
          "import torch.export's first-call module early",
          "MLflow 3 logs models with torch.export; its first use costs seconds", TORCH),
    Entry("torch.optim.lr_scheduler:LRScheduler", "member", "train/state.py",
          "get_last_lr() after a PBT exploit changed the rate", "no setter for the last rate", TORCH,
          value="_last_lr"),
    # ---- our own process-level tricks (kept where they act; listed so an audit finds them here)
    Entry("elastic_train/train/priority.py::os.setpriority(os.PRIO_PROCESS, tid, 0)", "ours",
          "train/worker.py, launch/controller.py",
          "niceness 0 for workers and the controller", "Ray starts workers at 15 (RayConfig worker_niceness)",
          RAY),
    Entry("tracking/mlflow_tracker.py::os.setpriority(os.PRIO_PROCESS, tid, min(19", "ours",
          "tracking/mlflow_tracker.py, tracking/checkpoints.py", "logging and checkpoint-copy threads yield",
          "training first on a shared machine", RAY),
    Entry("tracking/sender.py::os.nice(19 - os.nice(0))", "ours", "tracking/sender.py",
          "the rank-0 MLflow sender child at the lowest priority", "its import alone is seconds of CPU", MLFLOW),
    Entry("tracking/sender.py::os._exit(0)", "ours", "tracking/sender.py",
          "the sender detaches from the worker's process tree (fork, parent exits)", "outlives a stopped trial",
          MLFLOW),
    Entry("jobs/_cli.py::os._exit(code)", "ours", "jobs/*.py",
          "a finished job exits without interpreter teardown (seconds of torch/Ray/MLflow finalizers)",
          "the prompt comes back at once", RAY),
    Entry("tracking/quiet.py::os.environ.setdefault(MLFLOW_LOGGING_LEVEL", "ours", "every MLflow process",
          "process-wide MLflow environment defaults", "healthy runs quiet", MLFLOW),
    Entry("elastic_train/launch/trainer.py::os.environ[name] = _WRITTEN[name]", "ours",
          "the driver", "Ray Train's environment knobs from each run's config (a value the user set wins), propagated "
          "to the controller", "see the env entries", RAY),
    Entry("elastic_train/data/prepare.py::os.environ[\"TOKENIZERS_PARALLELISM\"] = \"false\"", "ours",
          "data/prepare.py", "one tokenizer process per core already", "tokenizers' fork warning", "tokenizers"),
)


def resolve(target: str) -> Any:
    """``module:qual.name`` -> the object."""
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def _params(fn: Any) -> tuple[str, ...]:
    """The parameter names, less ``_ray_trace_ctx``: Ray adds it, in place, to every method of a class it has made
    an actor (``ray.remote(cls)``), so an actor class's methods read differently once a process created it."""
    return tuple(name for name in inspect.signature(fn).parameters if name != "_ray_trace_ctx")


def problem(e: Entry) -> str | None:
    """What no longer holds for ``e`` under the installed versions, or None."""
    try:
        if e.kind == "ours":
            path, _, text = e.target.partition("::")
            return None if text in (ROOT / path).read_text() else f"{path} no longer holds {text!r}"
        if e.kind == "module":
            return None if importlib.util.find_spec(e.target) else f"module {e.target} is gone"
        if e.kind == "grpc":  # ``value``: package.Service.Method in the module's file descriptor
            service, _, method = e.value.rpartition(".")
            found = importlib.import_module(e.target).DESCRIPTOR.pool.FindServiceByName(service)
            return None if found.FindMethodByName(method) is not None else f"{e.value} is gone"
        obj = resolve(e.target)
        if e.kind == "fields":
            missing = [f for f in e.value.split(",") if f not in obj.DESCRIPTOR.fields_by_name]
            return f"{e.target} lacks {', '.join(missing)}" if missing else None
        if e.kind in ("env", "const"):
            return None if obj == e.value or getattr(obj, "name", None) == e.value else f"now names {obj!r}"
        if e.kind == "mirror":
            digest = hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]
            return None if digest == e.value else f"{e.target}'s source changed (sha256 {digest}): check our copy"
        if e.kind == "calls":  # a function that must still call ``value`` by its module-level name
            return None if f"{e.value}(" in inspect.getsource(obj) else f"{e.target} no longer calls {e.value}"
        if e.kind == "literal":  # an environment variable read under a literal name inside ``target``
            return None if f'"{e.value}"' in inspect.getsource(obj) else f"{e.target} no longer reads {e.value}"
        if e.kind == "member":
            sources = [inspect.getsource(c) for c in inspect.getmro(obj) if c.__module__.split(".")[0] != "builtins"]
            fields = getattr(obj, "__dataclass_fields__", {})
            found = hasattr(obj, e.value) or e.value in fields or any(f"self.{e.value}" in s for s in sources)
            return None if found else f"{e.value} not in {e.target} (nor its bases)"
        if e.params is not None and _params(obj) != e.params:
            return f"signature {_params(obj)}, expected {e.params}"
        if e.kind == "override" and e.ours:
            name = e.target.rsplit(".", 1)[1]
            mine = getattr(resolve(e.ours), name)
            if _params(mine) != _params(obj):
                return f"{e.ours}.{name} takes {_params(mine)}, upstream {_params(obj)}"
        return None
    except Exception as err:
        return f"{type(err).__name__}: {err}"
