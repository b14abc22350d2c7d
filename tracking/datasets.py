"""A run's data source as an MLflow dataset input (the run page's Datasets panel): name, digest, source URI,
schema and row count, logged with ``MlflowClient.log_inputs``.

The engine hands a plain dict (``elastic_train.data.spec.SourceInfo`` fields); no credential is ever part of it
(URIs such as ``s3://bucket/prefix`` carry none: keys come from the AWS environment).
"""

from __future__ import annotations

import json
from typing import Any


def source_type(uri: str) -> str:
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    return {"s3": "s3", "gs": "gcs", "http": "http", "https": "http", "file": "local"}.get(
        scheme, "local" if uri.startswith("/") else "code")


def dataset_entity(info: dict[str, Any]) -> Any:
    """The MLflow ``Dataset`` for a SourceInfo dict."""
    from mlflow.entities import Dataset

    uri = info.get("uri") or ""
    schema = {"mlflow_colspec": [{"name": k, "type": v} for k, v in (info.get("schema") or {}).items()]}
    profile = {"num_rows": info.get("num_rows"), **(info.get("profile") or {})}
    return Dataset(
        name=info["name"], digest=info["digest"], source_type=source_type(uri),
        source=json.dumps({"uri": uri}), schema=json.dumps(schema), profile=json.dumps(profile, default=str),
    )


def log_dataset_input(tracking_uri: str, run_id: str, info: dict[str, Any], context: str = "training") -> None:
    """Record ``info`` as one of the run's inputs (MLflow deduplicates the same dataset logged again)."""
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=tracking_uri).log_inputs(
        run_id, datasets=[DatasetInput(dataset_entity(info), tags=[InputTag("mlflow.data.context", context)])]
    )
