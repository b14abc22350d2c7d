"""data.name=ray from sources other than Parquet files: a user's function returning a ray.data.Dataset
(``data.dataset``, with ``data.options`` as its keyword arguments) and an image folder (PNG files decoded by a
preprocess, the class and the id from the path), each trained end to end on 2 gloo workers; CSV (a column a
pixel), JSON lines, NumPy (.npy rows split by a preprocess) and images read into the same rows as the Parquet
files; a function that returns no Dataset exits 2 naming data.dataset."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from elastic_train import config
from elastic_train.data.ray_source import build_ray
from tests.conftest import tiny
from tests.distributed.conftest import run_job
from tests.helpers.ray_data import (
    write_digits_csv,
    write_digits_images,
    write_digits_jsonl,
    write_digits_numpy,
    write_digits_parquet,
)

pytestmark = pytest.mark.distributed


def test_a_user_function_returning_a_ray_dataset_trains(ray_session, home, capsys):
    summary = run_job(home, "ray-fn", "data.name=ray", "data.dataset=tests.helpers.ray_data:digits_dataset",
                      "data.options={scale: 0.0625}", "data.features=[x]", "data.id_column=id", "train.epochs=1")
    out = capsys.readouterr().out
    assert "data read from tests.helpers.ray_data:digits_dataset (a ray.data.Dataset); materialised" in out
    assert summary["status"] == "FINISHED" and summary["final_metrics"]["val_accuracy"] > 0.5


def test_a_function_that_returns_no_dataset_exits_2_naming_the_field(ray_session, home, capsys):
    from jobs import train

    argv = ["--config", "configs/digits.yaml", *tiny("name=ray-fn-bad", f"checkpoint.storage_path={home}",
                                                     "data.name=ray", "data.features=[x]",
                                                     "data.dataset=tests.helpers.ray_data:not_a_dataset")]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert "data.dataset" in err and "returned list, not a ray.data.Dataset" in err


@pytest.fixture(scope="module")
def digit_images(tmp_path_factory) -> Path:
    """The 1797 digits as PNG files, written once for the module's two image tests."""
    folder = tmp_path_factory.mktemp("img")
    assert write_digits_images(str(folder)) == 1797
    return folder


def test_csv_numpy_and_images_read_into_the_rows_the_parquet_files_hold(ray_session, tmp_path, digit_images):
    write_digits_parquet(str(tmp_path / "parquet"))
    write_digits_csv(str(tmp_path / "csv"))
    write_digits_numpy(str(tmp_path / "npy"))
    write_digits_jsonl(str(tmp_path / "json"))
    sources = {
        "parquet": ["data.path=" + str(tmp_path / "parquet"), "data.features=[pixels]"],
        "csv": ["data.format=csv", "data.path=" + str(tmp_path / "csv"),
                "data.features=[" + ",".join(f"p{j}" for j in range(64)) + "]"],
        "json": ["data.format=json", "data.path=" + str(tmp_path / "json"), "data.features=[x]",
                 "data.preprocess=tests.helpers.ray_data:scale_pixels"],
        "numpy": ["data.format=numpy", "data.path=" + str(tmp_path / "npy"), "data.features=[x]",
                  "data.preprocess=tests.helpers.ray_data:split_numpy_rows"],
        "images": ["data.format=images", "data.path=" + str(digit_images), "data.features=[x]",
                   "data.preprocess=tests.helpers.ray_data:decode_digit_images"],
    }
    bundles = {k: build_ray(config.compose({}, config.parse_overrides(["data.name=ray", "data.id_column=id", *o])))
               for k, o in sources.items()}
    ref = bundles.pop("parquet")
    for fmt, b in bundles.items():
        assert b.info["format"] == fmt and b.info["mode"] == "materialize"
        assert b.spec == ref.spec and len(b.train) == len(ref.train) == 1438, fmt
        assert b.train.y.tolist() == ref.train.y.tolist() and b.val.y.tolist() == ref.val.y.tolist(), fmt
        scale = 1.0 if fmt == "csv" else 16.0  # CSV holds raw pixels; the preprocesses scale to 0..1
        tol = 0.5 if fmt == "images" else 1e-6  # 8-bit PNGs of 0..16 values
        np.testing.assert_allclose(b.train.x.numpy() * scale, ref.train.x.numpy(), atol=tol, err_msg=fmt)
    assert bundles["images"].info["files"] == 1797


def test_an_image_folder_trains(ray_session, home, capsys, digit_images):
    summary = run_job(home, "ray-images", "data.name=ray", "data.format=images", f"data.path={digit_images}",
                      "data.preprocess=tests.helpers.ray_data:decode_digit_images", "data.features=[x]",
                      "data.id_column=id", "train.epochs=1")  # one epoch is past 0.5 (the user-function test's too)
    out = capsys.readouterr().out
    assert "1797 images file(s)" in out
    assert summary["status"] == "FINISHED" and summary["final_metrics"]["val_accuracy"] > 0.5
