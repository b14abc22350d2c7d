"""Run identity on the driver: where MLflow lives, one run per logical run, and how it ends.

The driver resolves the tracking URI, checks it is reachable, and creates (or, on resume, finds by name)
the run before any worker starts. Workers receive a :class:`TrackingSpec` with the run id and log into
that run, so restarts, resizes and job resumes never create a second run.
"""

from __future__ import annotations

import os
import platform
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tracking.base import TrackingSpec, TrackingUnavailable

RUN_NAME_TAG = "elastic_train.run_name"
KIND_TAG = "elastic_train.kind"
STORAGE_TAG = "storage"  # where the run's checkpoints live: a run is found by (name, storage), not name alone
PASS_THROUGH_ENV = (
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_INSECURE_TLS",
    "MLFLOW_TRACKING_SERVER_CERT_PATH",
)




def resolve_uri(configured: str | None, home: Path) -> str:
    """``tracking.uri`` > ``$MLFLOW_TRACKING_URI`` > an absolute ``sqlite:///<home>/mlflow.db``.

    Relative sqlite paths are made absolute here, on the driver: Ray workers run in another directory.
    """
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{(Path.cwd() / uri.removeprefix('sqlite:///')).resolve()}"
    if "://" not in uri:  # a bare path: MLflow 3 refuses file stores, so treat it as a folder for sqlite
        uri = f"sqlite:///{(Path(uri).resolve() / 'mlflow.db')}"
    return uri


def is_server(uri: str) -> bool:
    return uri.startswith(("http://", "https://", "databricks"))


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Raise TrackingUnavailable unless an HTTP tracking server answers (with our credentials)."""
    if not uri.startswith(("http://", "https://")):
        return
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
    request = urllib.request.Request(url)
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        import base64

        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s):
            return
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise TrackingUnavailable(
                f"{uri} refused the credentials (HTTP {e.code}); set MLFLOW_TRACKING_USERNAME/PASSWORD"
            ) from None
        if e.code < 500:
            return  # the server answered (e.g. 404 for a missing experiment): it is up
        raise TrackingUnavailable(f"{uri} answered HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TrackingUnavailable(f"cannot reach {uri} ({reason})") from None


def get_or_create_experiment(client: Any, name: str, artifact_root: Path | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    location = artifact_root.resolve().as_uri() if artifact_root is not None else None
    try:
        return client.create_experiment(name, artifact_location=location)
    except Exception:  # lost a creation race with another process: use theirs
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_run(client: Any, experiment_id: str, run_name: str, parent_run_id: str | None = None,
             storage: str | None = None) -> Any | None:
    """The oldest run named ``run_name`` (under ``parent_run_id``) whose checkpoints live in ``storage``.

    Two runs of the same name in different storages are two logical runs (the second starts from step 0), so
    they get two MLflow runs; a run without the tag (created before its first tags were set) matches any."""
    query = f"tags.`{RUN_NAME_TAG}` = '{run_name}'"
    if parent_run_id:
        query += f" and tags.`mlflow.parentRunId` = '{parent_run_id}'"
    runs = client.search_runs(
        [experiment_id], filter_string=query, max_results=100, order_by=["attributes.start_time ASC"]
    )
    return next((r for r in runs if storage_matches(r.data.tags.get(STORAGE_TAG), storage)), None)


def storage_matches(tagged: str | None, storage: str | None) -> bool:
    return storage is None or tagged is None or tagged == storage


def start_run(
    uri: str,
    experiment: str,
    run_name: str,
    *,
    artifact_root: Path | None,
    spool_path: Path,
    kind: str = "train",
    parent_run_id: str | None = None,
    tags: dict[str, str] | None = None,
    system_metrics: bool = False,
    log_every_steps: int = 10,
    storage: str | None = None,
) -> tuple[TrackingSpec, bool]:
    """Find the run named ``run_name`` in ``storage`` (resume) or create it. Returns ``(spec, resumed)``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp_id = get_or_create_experiment(client, experiment, artifact_root if not is_server(uri) else None)
    run = find_run(client, exp_id, run_name, parent_run_id, storage)
    resumed = run is not None
    if run is None:
        all_tags = {RUN_NAME_TAG: run_name, KIND_TAG: kind, **(tags or {})}
        if storage is not None:
            all_tags[STORAGE_TAG] = storage
        if parent_run_id:
            all_tags["mlflow.parentRunId"] = parent_run_id
        run = client.create_run(exp_id, run_name=run_name, tags=all_tags)
    else:
        client.update_run(run.info.run_id, status="RUNNING")
    env = {k: os.environ[k] for k in PASS_THROUGH_ENV if k in os.environ}
    spec = TrackingSpec(
        backend="mlflow",
        uri=uri,
        run_id=run.info.run_id,
        experiment_id=exp_id,
        spool_path=str(spool_path),
        system_metrics=system_metrics,
        log_every_steps=log_every_steps,
        env=env,
    )
    return spec, resumed


def end_run(uri: str, run_id: str, status: str) -> None:
    """Mark the run FINISHED, FAILED or KILLED."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).set_terminated(run_id, status=status)


def last_logged_step(uri: str, run_id: str, key: str = "train_loss") -> int:
    """The highest step of ``key`` already in the run: a restarted or resumed run logs only steps after it,
    so the step axis stays monotonic and the steps lost with a dead process are logged again, once."""
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    latest = [m.step for m in getattr(run.data, "_metric_objs", []) if m.key == key]  # MLflow keeps the max step
    if latest:
        return max(latest)
    return max((m.step for m in MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)), default=-1)


def environment_params() -> dict[str, str]:
    """Versions, git commit and Ray job id: params that say what produced a run (no MLflow import: every
    backend uses it; the MLflow backend adds ``env.mlflow``)."""
    import ray
    import torch

    params = {
        "env.python": platform.python_version(),
        "env.torch": torch.__version__,
        "env.ray": ray.__version__,
        "env.cuda": torch.version.cuda or "none",
        "env.host": platform.node(),
    }
    commit = git_commit()
    if commit:
        params["env.git_commit"] = commit
    job_id = os.environ.get("RAY_JOB_SUBMISSION_ID") or os.environ.get("RAY_JOB_ID")
    if job_id:
        params["env.ray_job_id"] = job_id
    return params


def git_commit(cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
