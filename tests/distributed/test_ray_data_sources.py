"""data.name=ray from sources other than Parquet files: a user's function returning a ray.data.Dataset
(``data.dataset``, with ``data.options`` as its keyword arguments) and JSON lines files, each trained end to end
on 2 gloo workers; a function that returns no Dataset exits 2 naming data.dataset."""

from __future__ import annotations

import pytest

from tests.conftest import tiny
from tests.distributed.conftest import run_job
from tests.helpers.ray_data import write_digits_jsonl

pytestmark = pytest.mark.distributed


def test_a_user_function_returning_a_ray_dataset_trains(ray_session, home, capsys):
    summary = run_job(home, "ray-fn", "data.name=ray", "data.dataset=tests.helpers.ray_data:digits_dataset",
                      "data.options={scale: 0.0625}", "data.features=[x]", "data.id_column=id", "train.epochs=1")
    out = capsys.readouterr().out
    assert "data read from tests.helpers.ray_data:digits_dataset (a ray.data.Dataset); materialised" in out
    assert summary["status"] == "FINISHED" and summary["final_metrics"]["val_accuracy"] > 0.5


def test_json_lines_files_train(ray_session, home, tmp_path, capsys):
    write_digits_jsonl(str(tmp_path / "digits"), files=2)
    summary = run_job(home, "ray-json", "data.name=ray", f"data.path={tmp_path / 'digits'}", "data.format=json",
                      "data.preprocess=tests.helpers.ray_data:scale_pixels", "data.features=[x]",
                      "data.id_column=id", "train.epochs=1")
    out = capsys.readouterr().out
    assert "2 json file(s)" in out
    assert summary["status"] == "FINISHED" and summary["final_metrics"]["val_accuracy"] > 0.5


def test_a_function_that_returns_no_dataset_exits_2_naming_the_field(ray_session, home, capsys):
    from jobs import train

    argv = ["--config", "configs/digits.yaml", *tiny("name=ray-fn-bad", f"checkpoint.storage_path={home}",
                                                     "data.name=ray", "data.features=[x]",
                                                     "data.dataset=tests.helpers.ray_data:not_a_dataset")]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert "data.dataset" in err and "returned list, not a ray.data.Dataset" in err
