"""The job configuration's schema: one pydantic model per concern, each field with its default and description
(docs/config.md is generated from it: ``python -m elastic_train.config_reference``).

Reading a config (YAML files, dotted overrides, a stored run's config) and turning pydantic's errors into one
:class:`ConfigError` line is :mod:`elastic_train.config.parse`; ``elastic_train.config`` re-exports both.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Defined without pydantic (the torch-only engine modules raise it too); elastic_train.config re-exports it.
from elastic_train.errors import ConfigError

SCORE_METRICS = ("val_loss", "val_accuracy", "val_perplexity", "train_loss", "train_accuracy")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class Section(BaseModel):
    """Base for every section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, validate_default=True)


class ModelConfig(Section):
    name: str = Field("mlp", description="mlp | cnn | gpt, or 'package.module:function' returning an nn.Module.")
    hidden_sizes: list[int] = Field([256, 256], description="mlp: widths of the hidden layers.")
    channels: list[int] = Field([32, 64], description="cnn: output channels of the conv blocks.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout probability (mlp, cnn, gpt).")
    n_layer: int = Field(4, gt=0, description="gpt: transformer blocks.")
    n_head: int = Field(4, gt=0, description="gpt: attention heads per block.")
    d_model: int = Field(256, gt=0, description="gpt: embedding width; must be divisible by n_head.")
    seq_len: int = Field(128, gt=0, description="gpt: context length in tokens.")
    vocab_size: int = Field(256, gt=0, description="gpt: vocabulary size (256 for byte-level text).")
    options: dict[str, Any] = Field({}, description="Keyword arguments for a user 'module:function' model.")

    @field_validator("hidden_sizes", "channels")
    @classmethod
    def _positive_sizes(cls, v: list[int]) -> list[int]:
        if any(s <= 0 for s in v):
            raise ValueError("every size must be > 0")
        return v


class DataConfig(Section):
    name: str = Field(
        "digits",
        description="digits | synthetic | synthetic_tokens | text | tokens | ray (Ray Data, see docs/ray-data.md), "
        "or 'package.module:function' returning datasets.",
    )
    path: str | None = Field(None, description="text: a UTF-8 file or a folder of files, read as bytes; tokens: a "
                             "folder made by jobs.prepare_tokens; ray: a file or folder, local or s3://.")
    num_samples: int = Field(8192, gt=0, description="synthetic*: number of generated samples.")
    num_features: int = Field(64, gt=0, description="synthetic: input features per sample.")
    num_classes: int = Field(10, ge=2, description="synthetic: number of classes.")
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="Share of the samples held out for validation.")
    val_tokens: int | None = Field(
        None, gt=0, description="tokens: validate on this many tokens of the val split (null = all of it)."
    )
    loader_workers: int = Field(2, ge=0, description="DataLoader worker processes for map-style datasets.")
    options: dict[str, Any] = Field({}, description="Keyword arguments for a user 'module:function' dataset.")
    format: Literal["parquet", "csv", "json", "images", "numpy"] = Field(
        "parquet", description="ray: file format under data.path (json = JSON lines)."
    )
    dataset: str | None = Field(
        None, description="ray: 'package.module:function' returning a ray.data.Dataset, read instead of data.path "
        "(called with data.options as keyword arguments)."
    )
    features: list[str] = Field([], description="ray: the feature column(s), stacked into one float32 input.")
    feature_shape: list[int] | None = Field(None, description="ray: reshape each sample's features, e.g. [1, 8, 8].")
    label: str = Field("label", description="ray: the integer class label column.")
    id_column: str | None = Field(
        None, description="ray: a unique sample id column; rows are ordered by it (else by file and row order)."
    )
    preprocess: str | None = Field(
        None, description="ray: 'package.module:function' applied with map_batches to dicts of numpy columns."
    )
    preprocess_cpus: float = Field(1.0, gt=0.0, description="ray: CPUs per preprocess task (not the trainers').")
    preprocess_concurrency: int | None = Field(None, gt=0, description="ray: preprocess tasks at once; null = auto.")
    preprocess_block_rows: int | None = Field(
        1024, gt=0, description="ray: rows per block fed to the preprocess (Ray Data reads small files into few "
        "blocks, and one block is one task: split, a heavy preprocess runs on many CPUs at once); null = as read."
    )
    ray_mode: Literal["auto", "materialize", "stream"] = Field(
        "auto", description="ray: materialize (sorted in memory, bitwise resumable), stream (bigger than memory, "
        "exactly once per epoch; needs data.id_column) or auto (stream when the files exceed a quarter of the "
        "object store and data.id_column is set)."
    )
    ray_prefetch_batches: int = Field(
        1, ge=0, le=1, description="ray, stream: batches each worker reads ahead (0 or 1: with 2 or more, Ray 2.60 "
        "formats batches on as many threads, and a 2-node run lost one batch an epoch in about one epoch of ten)."
    )
    ray_shuffle_buffer: int | None = Field(
        None, gt=0,
        description="ray, stream: rows in each worker's local shuffle buffer (null = the seeded file order only).",
    )
    trace_path: str | None = Field(
        None, description="Debug: append the sample ids each worker consumes per step to PATH.rank<r> (JSONL)."
    )


class TrainConfig(Section):
    epochs: int = Field(10, gt=0, description="Passes over the training set (unless max_steps or max_tokens is set).")
    max_steps: int | None = Field(
        None, gt=0, description="Train this many optimizer steps instead of train.epochs (the LR schedule spans them)."
    )
    max_tokens: int | None = Field(
        None, gt=0, description="Train on this many tokens (samples for classification) instead of train.epochs."
    )
    global_batch_size: int = Field(
        128, gt=0, description="Samples per optimizer step, summed over all workers (the hyperparameter)."
    )
    micro_batch_size: int | None = Field(
        None, gt=0, description="Cap on samples per worker forward pass; more are gradient-accumulated."
    )
    lr: float = Field(3e-3, gt=0.0, description="Peak learning rate.")
    optimizer: Literal["sgd", "adam", "adamw"] = Field("adamw", description="sgd | adam | adamw.")
    momentum: float = Field(0.9, ge=0.0, lt=1.0, description="sgd: momentum.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adam/adamw: (beta1, beta2), e.g. [0.9, 0.95].")
    eps: float = Field(1e-8, gt=0.0, description="adam/adamw: epsilon.")
    weight_decay: float = Field(0.01, ge=0.0, description="Weight decay (decoupled for adamw).")
    schedule: Literal["constant", "cosine"] = Field("cosine", description="LR schedule after warmup.")
    warmup_steps: int = Field(10, ge=0, description="Linear warmup from 0 to lr over this many optimizer steps.")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="cosine: final lr as a fraction of lr.")
    grad_clip: float | None = Field(1.0, gt=0.0, description="Clip the global gradient norm to this; null = off.")
    precision: Literal["fp32", "bf16", "fp16"] = Field("fp32", description="Autocast dtype (fp16 uses a GradScaler).")
    compile: bool = Field(False, description="torch.compile the model.")
    activation_checkpointing: bool = Field(False, description="gpt: recompute block activations in backward.")
    sync_every_steps: int = Field(
        10, gt=0, description="Steps between sync points: every rank takes rank 0's clock-based decisions "
        "(checkpoint.every_seconds, the preemption check, an auto interval's change) in one small all-reduce, so "
        "this bounds how many steps a run takes to react to them. Logging (tracking.log_every_steps), epoch ends and "
        "step checkpoints are sync points too.")

    @field_validator("betas")
    @classmethod
    def _betas_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v

    @model_validator(mode="after")
    def _one_budget(self) -> TrainConfig:
        if self.max_steps is not None and self.max_tokens is not None:
            raise ConfigError("train.max_tokens", self.max_tokens,
                              f"train.max_steps={self.max_steps} is set too; give one budget: train.epochs, "
                              "train.max_steps or train.max_tokens")
        return self


class ScalingConfig(Section):
    num_workers: int | tuple[int, int] = Field(
        2, description="Workers (one per GPU, or per CPU slot): an int, or [min, max] for elastic training."
    )
    use_gpu: Literal["auto"] | bool = Field("auto", description="auto = use GPUs when the cluster has any.")
    autoscaling: bool = Field(
        False, description="The cluster autoscales: the preflight warns instead of refusing what it lacks now."
    )
    resources_per_worker: dict[str, float] | None = Field(
        None, description="Ray resources per worker, e.g. {CPU: 4, GPU: 1}; default 1 CPU (+1 GPU)."
    )
    strategy: Literal["ddp", "fsdp"] = Field("ddp", description="ddp replicates the model; fsdp shards it.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="How the worker group is laid out over nodes."
    )
    resize_check_interval_s: float = Field(
        30.0, gt=0.0, description="Elastic: how often a healthy run checks whether it can grow."
    )

    @field_validator("use_gpu", mode="before")
    @classmethod
    def _gpu_flag(cls, v: Any) -> Any:
        if isinstance(v, str) and v.lower() in ("true", "false", "auto"):
            return {"true": True, "false": False}.get(v.lower(), "auto")
        if not isinstance(v, bool) and v != "auto":
            raise ValueError("must be auto, true or false")
        return v

    @field_validator("num_workers", mode="before")
    @classmethod
    def _workers_shape(cls, v: Any) -> Any:
        if isinstance(v, list | tuple) and len(v) != 2:
            raise ValueError("must be an int or a [min, max] pair")
        return v

    @field_validator("num_workers")
    @classmethod
    def _workers_range(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        lo, hi = (v, v) if isinstance(v, int) else v
        if lo < 1:
            raise ValueError("worker counts must be >= 1")
        if lo > hi:
            raise ValueError(f"min ({lo}) must be <= max ({hi})")
        return v

    @property
    def min_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]

    @property
    def max_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]

    @property
    def elastic(self) -> bool:
        return self.min_workers != self.max_workers


class CheckpointConfig(Section):
    every_steps: int | Literal["auto"] | None = Field(
        None, description="Checkpoint every N optimizer steps (null = off); auto: the Young-Daly optimum from the "
        "measured checkpoint cost and failure rate (docs/faults.md#the-checkpoint-interval-auto)."
    )
    min_every_steps: int = Field(1, gt=0, description="every_steps=auto never goes below this many steps.")
    every_seconds: float | None = Field(120.0, gt=0.0, description="Checkpoint every T seconds (null = off).")
    at_epoch_end: bool = Field(True, description="Checkpoint at the end of every epoch.")
    storage_path: str | None = Field(
        None, description="Run storage (local, NFS, s3://, gs://); default <home>/results. Shared if multi-node."
    )
    keep: int = Field(2, gt=0, description="Keep the best `keep` checkpoints by `score`, plus the latest.")
    score: str = Field("val_loss", description="Reported metric that ranks checkpoints.")
    score_mode: Literal["min", "max"] = Field("min", description="Whether a lower or higher score is better.")

    @field_validator("every_steps")
    @classmethod
    def _positive(cls, v: int | str | None) -> int | str | None:
        if isinstance(v, int) and v <= 0:
            raise ValueError("should be greater than 0 (or auto, or null)")
        return v


class FailureConfig(Section):
    max_failures: int = Field(3, ge=-1, description="Worker-group failures to recover from; -1 = unlimited.")
    health_check_interval_s: float = Field(
        0.5, gt=0.0, description="Ray Train controller poll period; bounds report latency and failure detection."
    )
    worker_start_timeout_s: float = Field(
        30.0, gt=0.0, description="Give up on starting a worker group after this long and decide again."
    )
    connect_timeout_s: float = Field(
        30.0, gt=0.0, description="Wait this long for a Ray address to answer (TCP, then ray.init); then exit 2."
    )
    spare_workers: int | Literal["auto"] = Field(
        "auto", description="Warm worker processes each node keeps ready for a restart (torch imported; ~0.45 GB "
        "of memory each, ~1 % of a core while idle); auto = one per training worker on the node, 0 = none "
        "(docs/faults.md#warm-spares)."
    )
    spares_after_s: float = Field(
        60.0, ge=0.0, description="Start the spares this long after a worker group's first step: a short run "
        "never pays for them; a restart before then starts new processes."
    )
    mtbf_s: float | None = Field(
        None, gt=0.0, description="Prior mean time between failures of one worker (its node or GPU), seconds; "
        "checkpoint.every_steps=auto divides it by the workers and updates it with the run's restarts."
    )

    @field_validator("spare_workers")
    @classmethod
    def _not_negative(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 0:
            raise ValueError("should be 0 or more (or auto)")
        return v


class TrackingConfig(Section):
    enabled: bool = Field(True, description="Track the run at all.")
    backend: Literal["mlflow", "jsonl"] = Field(
        "mlflow", description="mlflow, or jsonl: JSON-lines files in a folder (no server, no MLflow)."
    )
    uri: str | None = Field(
        None, description="mlflow: tracking URI; default $MLFLOW_TRACKING_URI, else sqlite:///<home>/mlflow.db. "
        "jsonl: a folder; default <home>/tracking."
    )
    experiment: str = Field("elastic-train", description="MLflow experiment name.")
    log_every_steps: int = Field(
        10, gt=0, description="Log train metrics (and a progress line) every N optimizer steps, and at each epoch end "
        "and checkpoint. Logging only: how fast a run reacts to the clock is train.sync_every_steps.")
    system_metrics: bool = Field(True, description="Log CPU/GPU/memory system metrics from the rank-0 node.")
    log_checkpoints: list[Literal["none", "last", "best", "all"]] = Field(
        ["best", "last"], description="Which checkpoints to copy into MLflow artifacts."
    )
    register_model: str | None = Field(None, description="Register the final model under this name.")
    required: bool = Field(True, description="Fail at start (exit 2) when the tracking server is unreachable.")

    @field_validator("log_checkpoints", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v


class Distribution(Section):
    type: Literal["loguniform", "uniform", "choice", "grid", "randint"] = Field(
        description="loguniform | uniform | randint (low, high) or choice | grid (values)."
    )
    low: float | None = Field(None, description="Lower bound (loguniform, uniform, randint).")
    high: float | None = Field(None, description="Upper bound (loguniform, uniform, randint; exclusive for randint).")
    values: list[Any] | None = Field(None, description="Candidates (choice, grid).")

    @model_validator(mode="after")
    def _shape(self) -> Distribution:
        if self.type in ("choice", "grid"):
            if not self.values:
                raise ValueError(f"{self.type} needs a non-empty `values` list")
        else:
            if self.low is None or self.high is None:
                raise ValueError(f"{self.type} needs `low` and `high`")
            if self.low >= self.high:
                raise ValueError(f"low ({self.low}) must be < high ({self.high})")
            if self.type == "loguniform" and self.low <= 0:
                raise ValueError(f"loguniform needs low > 0, got {self.low}")
        return self


def _default_space() -> dict[str, Distribution]:
    return {
        "train.lr": Distribution(type="loguniform", low=1e-4, high=1e-1),
        "train.global_batch_size": Distribution(type="choice", values=[32, 64, 128, 256]),
    }


class SweepConfig(Section):
    num_samples: int = Field(8, gt=0, description="Trials to sample (per grid point when the space has grids).")
    search: Literal["random", "grid", "optuna"] = Field("random", description="random | grid | optuna (extra).")
    space: dict[str, Distribution] = Field(
        default_factory=_default_space, description="Dotted config key -> distribution."
    )
    metric: str = Field("val_loss", description="Metric the sweep optimises.")
    mode: Literal["min", "max"] = Field("min", description="Minimise or maximise `metric`.")
    scheduler: Literal["asha", "pbt", "none"] = Field(
        "asha", description="asha stops weak trials early; pbt clones strong trials into weak ones; none runs all."
    )
    grace_period: int = Field(1, gt=0, description="asha: epochs every trial runs before it can be stopped.")
    reduction_factor: float = Field(2.0, gt=1.0, description="asha: keep 1/reduction_factor at each rung.")
    perturbation_interval: int = Field(
        1, gt=0, description="pbt: epochs between exploit/explore decisions (each at a checkpoint)."
    )
    quantile_fraction: float = Field(
        0.25, gt=0.0, le=0.5, description="pbt: the bottom share of trials that clone the top share."
    )
    resample_probability: float = Field(
        0.25, ge=0.0, le=1.0, description="pbt: chance a cloned value is redrawn from the space instead of scaled."
    )
    synch: bool = Field(
        False, description="pbt: decide when every trial reached the interval (deterministic; all trials at once)."
    )
    max_concurrent_trials: Literal["auto"] | int = Field(
        "auto", description="Trials at once; auto = what the cluster can hold."
    )
    trial_cpus: float = Field(
        1.0, gt=0.0, description="CPUs reserved for each trial's driver (the Tune function that runs the trainer)."
    )

    @field_validator("max_concurrent_trials")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be >= 1 or 'auto'")
        return v


class PerfConfig(Section):
    peak_tflops: float | None = Field(None, gt=0.0, description="Device peak TFLOP/s for MFU; default from a table.")


class CompatConfig(Section):
    """**One switch for every upstream internal.** The engine runs on Ray's, MLflow's and torch's public APIs and
    documented settings; where a private name buys measured speed or fixes an upstream bug, it serves a named
    feature below, each with the public path it falls back to (elastic_train/compat/features.py; every name is
    listed with the public way that was tried in compat/registry.py). `compat.internals=off` (or
    `ELASTIC_TRAIN_INTERNALS=off` in the environment, for every process a job starts) runs on public APIs only;
    a list of names uses exactly those. A feature this Ray lacks (an older release, or an internal an upgrade
    changed) turns off by itself, and the preflight says so in one line (`internals: the public path instead of
    ...`); what the switch costs is measured in docs/benchmarks.md."""

    internals: str | list[str] | None = Field(
        None, description="Upstream internals the engine may use (docs/config.md#compat): 'on' (each feature's "
        "default), 'off' (public Ray, MLflow and torch APIs only), or a list of feature names; default "
        "$ELASTIC_TRAIN_INTERNALS, else 'on'.")

    @field_validator("internals")
    @classmethod
    def _known(cls, v: str | list[str] | None) -> str | list[str] | None:
        from elastic_train.compat.features import parse_switch

        if v is not None:
            parse_switch(v)  # ValueError names the unknown feature and lists the known ones
        return v


class JobConfig(Section):
    seed: int = Field(0, ge=0, description="Seeds model init, data split and data order.")
    name: str | None = Field(None, description="Run name; default <config name>-<timestamp>. Same name = resume.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    scaling: ScalingConfig = Field(default_factory=ScalingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    failure: FailureConfig = Field(default_factory=FailureConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    sweep: SweepConfig = Field(default_factory=SweepConfig)
    perf: PerfConfig = Field(default_factory=PerfConfig)
    compat: CompatConfig = Field(default_factory=CompatConfig)

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str | None) -> str | None:
        if v is not None and not re.match(NAME_PATTERN, v):
            raise ValueError("use letters, digits, '.', '_' and '-' (it names a storage folder)")
        return v

    @model_validator(mode="after")
    def _cross_fields(self) -> JobConfig:
        g, max_w = self.train.global_batch_size, self.scaling.max_workers
        if g < max_w:
            raise ConfigError(
                "train.global_batch_size",
                g,
                f"smaller than the maximum worker count {max_w}; every worker needs a sample",
            )
        if self.checkpoint.score not in SCORE_METRICS:
            raise ConfigError(
                "checkpoint.score",
                self.checkpoint.score,
                f"not a reported metric; use one of {', '.join(SCORE_METRICS)}",
            )
        if self.model.name == "gpt" and self.model.d_model % self.model.n_head:
            raise ConfigError("model.d_model", self.model.d_model, f"not divisible by model.n_head={self.model.n_head}")
        return self
