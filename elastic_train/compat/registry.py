"""Every upstream internal the code relies on, the feature it serves, the public way that was tried, and the check
that it is still there.

Each :class:`Entry` names the thing (``module:qualname``), what kind of reliance it is, the feature of
:mod:`.features` it serves (which is off, with the public path instead, when the switch says so or the entry is
gone), where it is used, what for, and which public API or setting was tried first and why it does not serve.
:func:`problem` says what is wrong with one entry under the installed versions (None: still as expected);
``tests/unit/test_compat.py`` (the canary) runs it over :data:`ENTRIES` for every feature the installed Ray has
(:attr:`~.features.Feature.since`), and :func:`~.features.unavailable_reason` runs it for a run, once per process.

Kinds:

* ``attr``: a private module attribute (class, function, constant); ``params``: its signature's parameter names.
* ``call``: a private callable we call by keyword: each of ``params`` must still be one of its parameters.
* ``override``: a private method our subclass ``ours`` overrides: it must exist upstream with ``params``, and ours
  must take the same parameters. A rename would leave ours never called.
* ``member``: a private attribute read or set on instances: the class's source must still assign it.
* ``env``: an environment knob; ``target`` is the upstream constant naming it, ``value`` the name we set.
* ``literal``: a string upstream uses under a literal name (an environment variable, an actor's name, a request
  id's format): the source of ``target`` must still hold ``"value"``.
* ``calls``: a private function whose source must still call ``value`` by its module-level name (we replace
  that name, so a call through anything else would bypass ours).
* ``const``: a private constant whose value we rely on (``value``).
* ``grpc``: a gRPC method we call by its path; ``target`` is the generated module, ``value`` ``package.Service.Method``.
* ``fields``: a generated protobuf message we build or read; ``value``: the comma-separated fields we use.
* ``mirror``: upstream code we copy a part of (``value``: the first 16 hex digits of the sha256 of its source):
  any change upstream, however small, fails the canary until the copy is checked against it again.
* ``module``: a private module we import: it must exist.

Not upstream internals, and so not here: the public settings we set (``RAY_DEDUP_LOGS_SKIP_REGEX``,
``RAY_worker_niceness``, ``RAY_AIR_NEW_OUTPUT``, ``TUNE_FUNCTION_THREAD_TIMEOUT_S``, MLflow's documented
environment variables: :data:`PUBLIC_SETTINGS`), and our own process-level tricks (:data:`OWN_TRICKS`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKED = "Ray 2.55.1 to 2.60.0, MLflow 3.5.1 to 3.17.2, torch 2.13.0"
ROOT = Path(__file__).resolve().parents[2]
_TRAIN = "ray.train.v2._internal.execution"
_POLICY = f"{_TRAIN}.scaling_policy.elastic:ElasticScalingPolicy"
_CLIENT = f"{_TRAIN}.scaling_policy.autoscaling_coordinator_client:TrainAutoscalingCoordinatorClient"
_COORD = "ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator"
_GCS_TABLES = "ray._private.state:GlobalState._connect_and_get_accessor"


@dataclass(frozen=True)
class Entry:
    target: str
    kind: str
    feature: str  # the feature(s) of compat/features.py it serves, comma-separated
    used_in: str
    purpose: str
    tried: str  # the public API or setting tried first, and why it does not serve
    params: tuple[str, ...] | None = None
    ours: str | None = None  # override: our subclass (module:Class)
    value: Any = None  # env: the variable's name as we set it; member: the attribute name; ...

    @property
    def key(self) -> str:
        return f"{self.target}#{self.value}" if self.value is not None else self.target


CALLBACKS_PUBLIC = ("Ray Train V2's public UserCallback has after_report and after_exception only; hooks on the "
                    "controller's start and failures, the worker group and the worker exist in its internal kinds")
NO_COORDINATOR_API = ("ScalingConfig has no scaling-policy field and no public view of the AutoscalingCoordinator "
                      "that sizes elastic runs")
NO_GCS_TABLES = ("ray.util.state needs the dashboard's state API (it fails without one, and with two Ray instances "
                 "on a host); ray.util.placement_group_table() has no creator, so no orphan can be told")
NO_TORCH = ("Ray's TorchConfig imports torch in the controller only to unpickle itself (~1.6 s per run and per "
            "trial); no public backend config without it")

ENTRIES: tuple[Entry, ...] = (
    # ---- train_knobs: Ray Train's environment knobs (ray/train/v2/_internal/constants.py)
    Entry("ray.train.v2._internal.constants:HEALTH_CHECK_INTERVAL_S_ENV_VAR", "env", "train_knobs",
          "launch/trainer.py", "report() waits for the controller's poll: 2 s per checkpoint by default",
          "no RunConfig or FailureConfig field; undocumented", value="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"),
    Entry("ray.train.v2._internal.constants:WORKER_GROUP_START_TIMEOUT_S_ENV_VAR", "env", "train_knobs",
          "launch/trainer.py", "a restart after a node loss retries sooner", "no RunConfig or FailureConfig field",
          value="RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"),
    Entry("ray.train.v2._internal.constants:ENABLE_PREEMPTION_WATCHER_ENV_VAR", "env", "no_preemption_watcher",
          "launch/trainer.py", "no PreemptionWatcher process per worker group on an embedded Ray",
          "FailureConfig's preemption fields tune the watcher, none turns it off",
          value="RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"),
    # ---- worker_warmup: a worker callback before the process group forms (train/warmup.py)
    Entry(f"{_TRAIN}.callback:WorkerCallback", "attr", "worker_warmup", "train/warmup.py (compat.ray_train)",
          "in each worker before the process group: warm imports, gloo's interface", CALLBACKS_PUBLIC),
    Entry(f"{_TRAIN}.callback:WorkerCallback.after_init_train_context", "attr", "worker_warmup", "train/warmup.py",
          "the worker hook WorkerWarmup overrides", CALLBACKS_PUBLIC, params=("self",)),
    # ---- warm_spares: idle worker processes prestarted with a Train worker's runtime env (train/spares.py)
    Entry("ray.core.generated.node_manager_pb2", "grpc", "warm_spares", "train/warmup.py (compat.ray_core)",
          "ask a node's raylet to prestart idle worker processes with a Train worker's runtime env",
          "the core worker's PrestartWorkers has no Python binding; runtime_env's worker_process_setup_hook is "
          "job-wide only", value="ray.rpc.NodeManagerService.PrestartWorkers"),
    Entry("ray.core.generated.node_manager_pb2:PrestartWorkersRequest", "fields", "warm_spares",
          "compat/ray_core.py", "the request we build (the keep-alive outlives Ray's 1 s idle reaping)", "as above",
          value="job_id,runtime_env_info,keep_alive_duration_secs,num_workers"),
    Entry("ray.core.generated.runtime_environment_pb2:RuntimeEnvInfo", "fields", "warm_spares",
          "compat/ray_core.py", "the runtime env the spares are made with", "as above",
          value="serialized_runtime_env,uris"),
    Entry("ray.core.generated.runtime_environment_pb2:RuntimeEnvUris", "fields", "warm_spares",
          "compat/ray_core.py", "the working dir and modules of that env", "as above",
          value="working_dir_uri,py_modules_uris"),
    Entry("ray.core.generated.common_pb2:Language.PYTHON", "const", "warm_spares", "compat/ray_core.py",
          "the spares' language: Python, the field's default (not set)", "as above", value=0),
    Entry("ray._private.ray_constants:WORKER_PROCESS_SETUP_HOOK_ENV_VAR", "const", "warm_spares",
          "train/spares.py (compat.ray_core.SETUP_HOOK_ENV)", "the Train workers' setup hook (it preloads torch in "
          "every spare)", "runtime_env's worker_process_setup_hook is read at the job level only (ray.init), not "
          "in an actor's runtime env", value="__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"),
    Entry("ray._private.runtime_env.setup_hook:load_and_execute_setup_hook_module", "attr", "warm_spares",
          "train/spares.py", "a string hook is imported as module.function", "as above",
          params=("worker_process_setup_hook_key",)),
    Entry("ray._private.grpc_utils:init_grpc_channel", "attr", "warm_spares,sweep_reaper,trial_reuse",
          "compat/ray_core.py (prestart_workers, gcs_channel)", "a channel to a raylet or the GCS as Ray's own "
          "clients open it (TLS and auth settings included)", "grpc.insecure_channel ignores Ray's TLS settings",
          params=("address", "options", "asynchronous", "credentials")),
    # ---- dead_run_requests: live Train controllers recorded in the GCS's key-value store (launch/reservations.py)
    Entry("ray.experimental.internal_kv:internal_kv_get_gcs_client", "attr", "dead_run_requests",
          "launch/reservations.py (compat.ray_core)", "each elastic run's controller and Train run, recorded at its "
          "start", "ray.experimental.internal_kv's _internal_kv_* take no timeout (every wait bounded); a named "
          "actor costs a process", params=()),
    Entry("ray._raylet:InnerGcsClient.internal_kv_put", "call", "dead_run_requests",
          "compat/ray_core.py kv_put",
          "as above", "as above", params=("key", "value", "overwrite", "namespace", "timeout")),
    Entry("ray._raylet:InnerGcsClient.internal_kv_get", "call", "dead_run_requests",
          "compat/ray_core.py kv_get",
          "as above", "as above", params=("key", "namespace", "timeout")),
    Entry("ray._raylet:InnerGcsClient.internal_kv_del", "call", "dead_run_requests",
          "compat/ray_core.py kv_delete_prefix",
          "as above", "as above", params=("key", "del_by_prefix", "namespace", "timeout")),
    Entry("ray._raylet:InnerGcsClient.internal_kv_keys", "call", "dead_run_requests",
          "compat/ray_core.py kv_keys",
          "the Train runs whose controller may have died (launch/reservations.py)", "as above",
          params=("prefix", "namespace", "timeout")),
    # ---- sweep_reaper: orphaned placement groups of stopped trials (ray#54305), sweep/placement_groups.py
    Entry(_GCS_TABLES, "attr", "sweep_reaper,trial_reuse,dead_run_requests", "compat/ray_core.py (gcs_actors)",
          "the GCS's placement-group and actor tables, filtered by job and state", NO_GCS_TABLES, params=("self",)),
    Entry("ray._raylet:GlobalStateAccessor.get_actor_table", "call", "sweep_reaper,trial_reuse",
          "compat/ray_core.py (gcs_actors)",
          "the GCS filters the actor table by job and state: a scan costs what this job holds, not what the "
          "cluster's history holds", NO_GCS_TABLES, params=("job_id", "actor_state_name")),
    Entry("ray._raylet:GlobalStateAccessor.get_placement_group_table", "attr", "sweep_reaper",
          "compat/ray_core.py (placement_groups)", "every placement group's record", NO_GCS_TABLES, params=("self",)),
    Entry("ray.train.v2._internal.execution.controller.controller:TrainController", "attr", "sweep_reaper,trial_reuse",
          "compat/ray_core.py (TRAIN_CONTROLLER)", "Ray Train's controller actors, by class name in the actor table",
          NO_GCS_TABLES),
    Entry("ray.train.v2._internal.execution.controller.placement_group_cleaner:PlacementGroupCleaner", "attr",
          "sweep_reaper", "compat/ray_core.py (PG_CLEANER)", "Ray Train's cleaner actors, by class name",
          NO_GCS_TABLES),
    Entry("ray.core.generated.gcs_pb2:PlacementGroupTableData", "fields", "sweep_reaper", "compat/ray_core.py",
          "a live actor-created group whose creator died", NO_GCS_TABLES,
          value="placement_group_id,state,creator_job_id,creator_actor_id,creator_actor_dead,is_detached"),
    Entry("ray._raylet:GlobalStateAccessor.get_actor_info", "call", "dead_run_requests",
          "compat/ray_core.py (actor_alive)", "one actor's record: is a recorded Train controller still alive",
          NO_GCS_TABLES, params=("actor_id",)),
    Entry("ray.core.generated.gcs_pb2:ActorTableData", "fields", "sweep_reaper,trial_reuse,dead_run_requests",
          "compat/ray_core.py",
          "Train controllers and their PlacementGroupCleaners, alive or dead", NO_GCS_TABLES,
          value="actor_id,class_name,state,job_id,address,owner_address"),
    Entry("ray.core.generated.gcs_service_pb2", "grpc", "sweep_reaper,trial_reuse", "compat/ray_core.py (kill_actors)",
          "end an actor this process holds no handle to (a stranded cleaner, a stopped trial's controller)",
          "ray.kill needs a handle; those actors are unnamed", value="ray.rpc.ActorInfoGcsService.KillActorViaGcs"),
    Entry("ray.core.generated.gcs_service_pb2:KillActorViaGcsRequest", "fields", "sweep_reaper,trial_reuse",
          "compat/ray_core.py (kill_actors)", "the kill as ray.kill sends it (no restart)", "as above",
          value="actor_id,force_kill,no_restart"),
    # ---- trial_reuse: a stopped trial ends its Train run, so Tune can hand its process on (sweep/stops.py)
    Entry("ray.train._internal.session:get_session", "attr", "trial_reuse", "compat/ray_tune.py (trial_stop_event)",
          "the running trial's session in its Tune actor", "no public view of a trial's stop in the function API",
          params=()),
    Entry("ray.train._internal.session:_TrainSession", "member", "trial_reuse", "compat/ray_tune.py",
          "Tune sets it when it stops a trial or hands its actor to the next", "as above", value="stop_event"),
    # ---- auth_probe: the GCS's auth check before ray.init (launch/reach.py)
    Entry("ray.core.generated.gcs_service_pb2", "grpc", "auth_probe", "compat/ray_core.py (gcs_refuses_token)",
          "ask the GCS whether it accepts this client's token, before ray.init", "ray.init prints ~20 s of "
          "InvalidAuthToken lines, then a bare ConnectionError", value="ray.rpc.NodeInfoGcsService.GetClusterId"),
    Entry("ray._private.authentication.authentication_constants:AUTHORIZATION_HEADER_NAME", "const", "auth_probe",
          "compat/ray_core.py (AUTH_METADATA)", "the gRPC metadata key Ray's clients send the token in",
          "the probe sends the token as Ray does", value="authorization"),
    Entry("ray._private.authentication.authentication_constants:AUTHORIZATION_BEARER_PREFIX", "const", "auth_probe",
          "compat/ray_core.py (gcs_refuses_token)", "the token's prefix in that header", "as above", value="Bearer "),
    # ---- console_blocks: Ray's forwarded-output printers, wrapped (launch/quiet.py)
    Entry("ray._private.ray_logging:global_worker_stdstream_dispatcher", "attr", "console_blocks",
          "launch/quiet.py (compat.ray_core)", "multi-line blocks (a dead worker's traceback, crash dumps) become "
          "one line", "RAY_DEDUP_LOGS_SKIP_REGEX drops single lines (used: launch/quiet.py SKIP_REGEX), not blocks"),
    Entry("ray._private.ray_logging:WorkerStandardStreamDispatcher", "member", "console_blocks", "launch/quiet.py",
          "the handler list we wrap", "as above", value="handlers"),
    Entry("ray._private.ray_logging:WorkerStandardStreamDispatcher", "member", "console_blocks", "launch/quiet.py",
          "its lock", "as above", value="_lock"),
    Entry("ray._private.worker:print_to_stdstream", "attr", "console_blocks", "launch/quiet.py (compat.ray_core)",
          "a raylet's multi-line pushes (C++ stack traces, 'Raylet is terminated' tails) become one line",
          "as above", params=("data", "ignore_prefix")),
    Entry("ray._private.worker:listen_error_messages", "calls", "console_blocks", "compat/ray_core.py",
          "the thread that prints raylet messages calls print_to_stdstream by its module-level name",
          "a call through anything else would bypass the wrapper", value="print_to_stdstream"),
    # ---- lean_callbacks: Ray Train's default callbacks with fewer helper processes (launch/controller.py)
    Entry("ray.train.torch:TorchTrainer._create_default_callbacks", "override", "lean_callbacks", "launch/trainer.py",
          "Ray Train's callbacks less a DatasetManager where no Ray Data is read and a PlacementGroupCleaner where "
          "the driver reaps", "no public way to leave out a default callback (RunConfig.callbacks only adds)",
          params=("self",), ours="elastic_train.launch.trainer:_Trainer"),
    Entry("ray.train.v2._internal.callbacks.datasets:DatasetsCallback", "attr", "lean_callbacks",
          "launch/controller.py (compat.ray_train)", "the callback left out of a run that reads no Ray Data",
          "as above"),
    Entry("ray.train.v2._internal.callbacks.placement_group_callback:PlacementGroupCleanerCallback", "attr",
          "lean_callbacks", "launch/controller.py (compat.ray_train)", "left out where the driver reaps",
          "as above"),
    # ---- light_controller: the torch backend's controller half without torch (compat/torch_backend.py)
    Entry("ray.train.torch.config:_TorchBackend", "mirror", "light_controller", "compat/torch_backend.py",
          "its controller half for gloo / nccl over env://", NO_TORCH, value="8476765a740b96e3"),
    Entry("ray.train.torch.config:TorchConfig", "mirror", "light_controller", "compat/torch_backend.py",
          "the same fields, defaults, context and framework", NO_TORCH, value="7666b34edd7a7e0d"),
    Entry("ray.train.torch.config:_setup_torch_process_group", "call", "light_controller",
          "compat/torch_backend.py (in the worker)", "every rank's init_process_group", NO_TORCH,
          params=("backend", "world_rank", "world_size", "init_method", "timeout_s")),
    Entry("ray.train.torch.config:_set_torch_distributed_env_vars", "attr", "light_controller",
          "compat/torch_backend.py (in the worker)", "RANK, LOCAL_RANK, WORLD_SIZE before the group forms",
          NO_TORCH, params=()),
    Entry("ray.train.torch.config:_shutdown_torch", "call", "light_controller",
          "compat/torch_backend.py (in the worker)", "the group destroyed at a worker group's end", NO_TORCH,
          params=("destroy_process_group",)),
    Entry("ray.train.torch.config:TorchConfigContextManager", "attr", "light_controller", "compat/torch_backend.py",
          "the CUDA device set around the training function", NO_TORCH),
    Entry("ray.train.v2._internal.util:TrainingFramework.TORCH", "attr", "light_controller",
          "compat/torch_backend.py", "the run's framework, as TorchConfig gives it", NO_TORCH),
    Entry("ray.train._internal.utils:get_address_and_port", "attr", "light_controller",
          "compat/torch_backend.py (on worker 0)", "the process group's master address", NO_TORCH, params=()),
    # ---- elastic_trials: a trial's floor and its growth (sweep/elastic.py)
    Entry("ray.train.torch:TorchTrainer._initialize_and_run_controller", "override", "elastic_trials",
          "launch/trainer.py", "hand the controller a trial's scaling policy", NO_COORDINATOR_API,
          params=("self", "controller_init_kwargs"), ours="elastic_train.launch.trainer:_Trainer"),
    Entry(f"{_POLICY}._get_num_workers_for_resource_request", "override", "elastic_trials", "sweep/elastic.py",
          "a trial asks only for what it may grow by", NO_COORDINATOR_API, params=("self",),
          ours="elastic_train.sweep.elastic:TrialScalingPolicy"),
    Entry(f"{_POLICY}._count_possible_workers", "override", "elastic_trials", "sweep/elastic.py",
          "a trial's size: its floor plus the extra reserved to it", NO_COORDINATOR_API,
          params=("self", "reserved_resources"), ours="elastic_train.sweep.elastic:TrialScalingPolicy"),
    Entry(f"{_POLICY}.after_controller_start", "override", "elastic_trials", "sweep/elastic.py",
          "the trial's own requester id and client", NO_COORDINATOR_API, params=("self", "train_run_context"),
          ours="elastic_train.sweep.elastic:TrialScalingPolicy"),
    Entry(f"{_POLICY}._send_resource_request", "attr", "elastic_trials", "sweep/elastic.py",
          "called by our after_controller_start", NO_COORDINATOR_API, params=("self",)),
    Entry(_POLICY, "member", "elastic_trials", "sweep/elastic.py", "set by our after_controller_start",
          NO_COORDINATOR_API, value="_requester_id"),
    Entry(_POLICY, "member", "elastic_trials", "sweep/elastic.py", "set by our after_controller_start",
          NO_COORDINATOR_API, value="_coordinator_client"),
    Entry(f"{_CLIENT}.send_resource_request", "override", "elastic_trials", "sweep/elastic.py",
          "the same request at MEDIUM priority (growth after every floor)", NO_COORDINATOR_API,
          params=("self", "scaling_config", "num_workers"), ours="elastic_train.sweep.elastic:_ExtraClient"),
    Entry(_CLIENT, "member", "elastic_trials", "sweep/elastic.py", "read by our send_resource_request",
          NO_COORDINATOR_API, value="_autoscaling_coordinator"),
    Entry(_CLIENT, "member", "elastic_trials", "sweep/elastic.py", "read by our send_resource_request",
          NO_COORDINATOR_API, value="_requester_id"),
    Entry(_CLIENT, "member", "elastic_trials", "sweep/elastic.py", "set by our send_resource_request",
          NO_COORDINATOR_API, value="_latest_autoscaling_request_time"),
    Entry(f"{_TRAIN}.scaling_policy.autoscaling_coordinator_client:AUTOSCALING_REQUESTS_EXPIRE_TIME_S", "attr",
          "elastic_trials", "sweep/elastic.py", "a floor's expiry (re-sent before it)", NO_COORDINATOR_API),
    Entry(f"{_TRAIN}.scaling_policy.autoscaling_coordinator_client:AUTOSCALING_REQUESTS_GET_TIMEOUT_S", "attr",
          "elastic_trials", "sweep/elastic.py", "the request's timeout, as Ray's own client", NO_COORDINATOR_API),
    Entry(f"{_COORD}:_AutoscalingCoordinatorActor.request_resources", "call", "elastic_trials", "sweep/elastic.py",
          "a trial's floor, called by keyword on the actor", NO_COORDINATOR_API,
          params=("requester_id", "resources", "expire_after_s", "priority", "label_selectors")),
    Entry(f"{_COORD}:ResourceRequestPriority", "member", "elastic_trials", "sweep/elastic.py", "HIGH for floors",
          NO_COORDINATOR_API, value="HIGH"),
    Entry(f"{_COORD}:ResourceRequestPriority", "member", "elastic_trials", "sweep/elastic.py", "MEDIUM for growth",
          NO_COORDINATOR_API, value="MEDIUM"),
    Entry("ray.train._internal.autoscaling_coordinator_client:build_train_resource_request", "attr",
          "elastic_trials", "sweep/elastic.py", "the request body, as Ray Train builds it", NO_COORDINATOR_API,
          params=("scaling_config", "num_workers")),
    # ---- dead_run_requests: a dead Train run's reservation released, a lost node seen at once (launch/)
    Entry(f"{_COORD}:get_or_create_autoscaling_coordinator", "attr", "dead_run_requests,elastic_trials",
          "compat/ray_train.py",
          "the cluster-wide coordinator elastic runs reserve their workers with", NO_COORDINATOR_API, params=()),
    Entry(f"{_COORD}:_AutoscalingCoordinatorActor.cancel_request", "call", "dead_run_requests",
          "compat/ray_train.py (cancel_resource_requests)", "a dead run's (or a stopped trial's) request",
          NO_COORDINATOR_API, params=("requester_id",)),
    Entry(f"{_COORD}:_AutoscalingCoordinatorActor.get_reserved_resources", "call", "fresh_cluster_view",
          "compat/ray_train.py (refresh_reservations)", "the coordinator's view recomputed after a failure",
          NO_COORDINATOR_API, params=("requester_id", "recompute")),
    Entry(f"{_COORD}:get_or_create_autoscaling_coordinator", "literal", "dead_run_requests,fresh_cluster_view",
          "compat/ray_train.py",
          "the coordinator actor's name, looked up without creating it", NO_COORDINATOR_API,
          value="AutoscalingCoordinator"),
    Entry(f"{_TRAIN}.scaling_policy.scaling_policy:ScalingPolicy.after_controller_start", "literal",
          "dead_run_requests", "compat/ray_train.py (train_run_requester)", "the requester id of a Train run",
          NO_COORDINATOR_API, value="train-{train_run_context.run_id}"),
    Entry(f"{_TRAIN}.context:get_train_context", "attr", "dead_run_requests", "compat/ray_train.py (train_run_id)",
          "Ray Train's run id in a worker (a checkpoint names the run that wrote it)", "no public run id",
          params=()),
    Entry(f"{_TRAIN}.context:TrainRunContext", "member", "dead_run_requests", "compat/ray_train.py",
          "the run id on the train run context", "no public run id", value="run_id"),
    Entry(f"{_TRAIN}.callback:ControllerCallback", "attr",
          "dead_run_requests,fresh_cluster_view,restart_markers",
          "launch/controller.py (RecordTrainRun, FreshClusterView, RestartPhases)", "the controller notes its run; "
          "a failure refreshes the coordinator; the benchmarks' restart phases", CALLBACKS_PUBLIC),
    Entry(f"{_TRAIN}.callback:ControllerCallback.after_controller_start", "attr", "dead_run_requests",
          "launch/controller.py", "the controller's start hook", CALLBACKS_PUBLIC,
          params=("self", "train_run_context")),
    Entry(f"{_TRAIN}.callback:ControllerCallback.before_controller_execute_failure_decision", "attr",
          "fresh_cluster_view,restart_markers", "launch/controller.py", "the controller's failure hook",
          CALLBACKS_PUBLIC, params=("self", "failure_decision")),
    # ---- restart_markers: the controller's phases of a restart, for the benchmarks (launch/controller.py)
    Entry(f"{_TRAIN}.callback:WorkerGroupCallback", "attr", "restart_markers", "launch/controller.py",
          "worker-group start and shutdown hooks", CALLBACKS_PUBLIC),
    # ---- pbt_sync: synchronous PBT's private sync state (sweep/relay.py LastReportKeepsPBT)
    Entry("ray.tune.schedulers:PopulationBasedTraining", "member", "pbt_sync", "sweep/relay.py",
          "the sync point a synchronous PBT waits at", "PBT has no public view of its sync point",
          value="_next_perturbation_sync"),
    Entry("ray.tune.schedulers:PopulationBasedTraining", "member", "pbt_sync", "sweep/relay.py",
          "each trial's state (its last reported time)", "as above", value="_trial_state"),
    Entry("ray.tune.schedulers:PopulationBasedTraining", "member", "pbt_sync", "sweep/relay.py",
          "the interval to the next sync point", "as above", value="_perturbation_interval"),
    Entry("ray.tune.schedulers.pbt:_PBTTrialState", "member", "pbt_sync", "sweep/relay.py",
          "a trial's last reported time", "as above", value="last_train_time"),
    Entry("ray.tune.execution.tune_controller:TuneController.get_live_trials", "attr", "pbt_sync",
          "sweep/relay.py", "the trials a sync point still waits for", "the scheduler hooks get the controller "
          "only; its class is internal", params=("self",)),
    # ---- pbt_last_lr (compat/torch.py)
    Entry("torch.optim.lr_scheduler:LRScheduler", "member", "pbt_last_lr", "train/state.py",
          "get_last_lr() after a PBT exploit changed the rate", "no setter for the last rate", value="_last_lr"),
)


# Public settings this code sets (documented upstream): not internals, listed so that an audit finds them.
PUBLIC_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("RAY_DEDUP_LOGS_SKIP_REGEX", "launch/quiet.py", "docs.ray.io: Ray logging, log deduplication"),
    ("RAY_worker_niceness", "launch/context.py, cluster/local/*.sh", "Ray's RayConfig, read from RAY_<name>"),
    ("RAY_USAGE_STATS_ENABLED", "launch/context.py (embedded Ray)", "docs.ray.io: Usage Stats Collection"),
    ("RAY_enable_metrics_collection", "launch/context.py (embedded Ray)", "docs.ray.io: Ray metrics, RayConfig"),
    ("RAY_ADDRESS", "launch/reach.py (a cluster job's processes, when Ray Train's cleaner could ask another cluster)",
     "docs.ray.io: ray.init, Ray Jobs"),
    ("RAY_AIR_NEW_OUTPUT", "compat/ray_tune.py", "docs.ray.io: Ray AIR environment variables"),
    ("TUNE_FUNCTION_THREAD_TIMEOUT_S", "compat/ray_tune.py", "docs.ray.io: Environment variables used by Ray Tune"),
    ("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "compat/ray_data.py", "Ray Data's footer-reader pool (Ray 2.60)"),
    ("GLOO_SOCKET_IFNAME", "cluster/local/*.sh, train/netif.py", "PyTorch distributed: Common environment variables"),
    ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "compat/mlflow.py", "mlflow.environment_variables"),
    ("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "compat/mlflow.py", "mlflow.environment_variables"),
    ("MLFLOW_LOGGING_LEVEL", "tracking/quiet.py", "mlflow.environment_variables"),
    ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "tracking/mlflow_tracker.py", "mlflow.environment_variables"),
    ("MLFLOW_HTTP_REQUEST_TIMEOUT", "tracking/mlflow_tracker.py", "mlflow.environment_variables"),
)

# Our own process-level tricks, kept where they act (``path::text``: the file must still hold the text).
OWN_TRICKS: tuple[tuple[str, str], ...] = (
    ("elastic_train/train/priority.py::os.setpriority(os.PRIO_PROCESS, tid, 0)",
     "a worker Ray started at niceness 15 back at 0 where the process may (root or CAP_SYS_NICE)"),
    ("tracking/mlflow_tracker.py::os.setpriority(os.PRIO_PROCESS, tid, min(19",
     "logging and checkpoint-copy threads yield to training"),
    ("tracking/sender.py::os.nice(19 - os.nice(0))", "the rank-0 MLflow sender child at the lowest priority"),
    ("tracking/sender.py::os._exit(0)", "the sender detaches from the worker's process tree (fork, parent exits)"),
    ("jobs/_cli.py::os._exit(code)", "a finished job exits without interpreter teardown"),
    ("elastic_train/data/prepare.py::os.environ[\"TOKENIZERS_PARALLELISM\"] = \"false\"",
     "one tokenizer process per core already"),
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
        if e.kind == "literal":  # a string read or built under a literal name inside ``target``
            source = inspect.getsource(obj)
            return None if f'"{e.value}"' in source or f'f"{e.value}"' in source else \
                f"{e.target} no longer reads {e.value}"
        if e.kind == "member":
            sources = [inspect.getsource(c) for c in inspect.getmro(obj) if c.__module__.split(".")[0] != "builtins"]
            fields = getattr(obj, "__dataclass_fields__", {})
            found = hasattr(obj, e.value) or e.value in fields or any(f"self.{e.value}" in s for s in sources)
            return None if found else f"{e.value} not in {e.target} (nor its bases)"
        if e.kind == "call":
            missing = [p for p in e.params or () if p not in _params(obj)]
            return f"{e.target} takes no {', '.join(missing)} (takes {_params(obj)})" if missing else None
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


def entries_of(feature: str) -> tuple[Entry, ...]:
    return tuple(e for e in ENTRIES if feature in e.feature.split(","))
