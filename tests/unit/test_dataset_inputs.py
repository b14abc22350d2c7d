"""Every run's data source becomes a dataset input: derived for built-in and in-memory sets, its own for Ray Data;
recorded by the MLflow backend (the run page's Datasets panel) and the jsonl backend."""

from __future__ import annotations

import json

import pytest
import torch

from elastic_train.data.spec import DataBundle, DataSpec, SourceInfo, TensorSet, source_of


def bundle(seed: int = 0) -> DataBundle:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(10, 4, generator=g), torch.randint(0, 3, (10,), generator=g)
    return DataBundle(TensorSet(x[:8], y[:8]), TensorSet(x[8:], y[8:]), DataSpec("classification", (4,), 3),
                      {"source": "synthetic teacher"})


def test_an_in_memory_set_gets_a_content_digest_schema_and_row_count():
    info = source_of(bundle(), "synthetic")
    assert info.uri == "synthetic teacher" and info.num_rows == 10
    assert info.schema == {"x": "float32[4]", "y": "int64[]"}
    assert info.profile == {"train_samples": 8, "val_samples": 2}
    assert info.digest == source_of(bundle(), "synthetic").digest != source_of(bundle(seed=1), "synthetic").digest


def test_a_source_of_its_own_wins():
    own = SourceInfo("ray:parquet", "s3://b/digits", "abc", {"x": "float"}, 5)
    b = bundle()
    b.source = own
    assert source_of(b, "ray") is own


def test_the_jsonl_backend_records_the_input_once_per_digest(tmp_path):
    from tracking.jsonl import JsonlBackend

    backend = JsonlBackend(str(tmp_path / "t"), tmp_path)
    backend.check()
    spec, _ = backend.start_run("exp", "r", kind="train", spool_path=tmp_path / "spool.jsonl")
    info = vars(source_of(bundle(), "synthetic"))
    backend.log_dataset(spec, info)
    backend.log_dataset(spec, info)
    run = json.loads(next((tmp_path / "t").glob("exp/*/run.json")).read_text())
    assert [i["digest"] for i in run["inputs"]] == [info["digest"]]


@pytest.mark.slow  # creates an MLflow sqlite store (~2-3 s)
def test_the_mlflow_backend_fills_the_datasets_panel(tmp_path):
    from mlflow.tracking import MlflowClient

    from tracking.mlflow_backend import MlflowBackend

    backend = MlflowBackend(f"sqlite:///{tmp_path}/mlflow.db", tmp_path)
    spec, _ = backend.start_run("exp", "r", kind="train", spool_path=tmp_path / "spool.jsonl")
    info = vars(SourceInfo("ray:parquet", "s3://bkt/digits", "0123abcd", {"x": "float[64]", "label": "int64"}, 1797,
                           {"files": 3}))
    backend.log_dataset(spec, info)
    (inp,) = MlflowClient(spec.uri).get_run(spec.run_id).inputs.dataset_inputs
    d = inp.dataset
    assert (d.name, d.digest, d.source_type) == ("ray:parquet", "0123abcd", "s3")
    assert json.loads(d.source) == {"uri": "s3://bkt/digits"}
    assert json.loads(d.profile)["num_rows"] == 1797
    assert [c["name"] for c in json.loads(d.schema)["mlflow_colspec"]] == ["x", "label"]
    assert {t.key: t.value for t in inp.tags} == {"mlflow.data.context": "training"}
