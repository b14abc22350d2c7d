"""data.name=ray: the driver-side checks that need no Ray (files, columns, preprocess) name the field and exit 2."""

from __future__ import annotations

import pytest

from elastic_train import config
from elastic_train.config import ConfigError
from elastic_train.data.ray_source import validate
from tests.helpers.ray_data import write_digits_parquet


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("digits-parquet")
    write_digits_parquet(str(d), files=2)
    return str(d)


def job(*overrides: str):
    return config.compose({}, config.parse_overrides(["data.name=ray", *overrides]))


def test_a_good_config_lists_the_files_in_order(parquet_dir):
    found = validate(job(f"data.path={parquet_dir}", "data.features=[pixels]", "data.id_column=id"))
    assert [f.rsplit("/", 1)[-1] for f in found.files] == ["part-000.parquet", "part-001.parquet"]
    assert found.total_bytes > 0


@pytest.mark.parametrize(("overrides", "field", "words"), [
    (["data.features=[pixels]"], "data.path", "needs a file or folder"),
    (["data.path={d}", "data.features=[pixels]", "data.format=csv"], "data.path", "no csv files"),
    (["data.path={d}/nothing-here", "data.features=[pixels]"], "data.path", "no parquet files"),
    (["data.path={d}"], "data.features", "at least one feature column"),
    (["data.path={d}", "data.features=[pixel]"], "data.features", "no column 'pixel'"),
    (["data.path={d}", "data.features=[pixels]", "data.label=target"], "data.label", "no such column"),
    (["data.path={d}", "data.features=[pixels]", "data.id_column=uid"], "data.id_column", "no such column"),
    (["data.path={d}", "data.features=[pixels]", "data.preprocess=tests.helpers.ray_data:nope"],
     "data.preprocess", "no callable 'nope'"),
    (["data.path={d}", "data.features=[pixels]", "data.preprocess=no_such_module:f"],
     "data.preprocess", "cannot import"),
    (["data.dataset=tests.helpers.ray_data:nope", "data.features=[x]"], "data.dataset", "no callable 'nope'"),
    (["data.dataset=no_such_module:f", "data.features=[x]"], "data.dataset", "cannot import"),
    (["data.dataset=tests.helpers.ray_data:digits_dataset", "data.path={d}", "data.features=[x]"],
     "data.dataset", "not both"),
])
def test_bad_input_names_the_field(parquet_dir, overrides, field, words):
    with pytest.raises(ConfigError) as e:
        validate(job(*(o.format(d=parquet_dir) for o in overrides)))
    assert e.value.field == field and words in str(e.value)


def test_a_dataset_function_needs_no_files():
    found = validate(job("data.dataset=tests.helpers.ray_data:digits_dataset", "data.features=[x]",
                         "data.options={scale: 0.5}"))
    assert found.files == [] and found.function == "tests.helpers.ray_data:digits_dataset"
    assert found.options == {"scale": 0.5}


def test_missing_bucket_names_data_path(s3_bucket):
    with pytest.raises(ConfigError) as e:
        validate(job("data.path=s3://no-such-bucket-here/digits", "data.features=[pixels]"))
    assert e.value.field == "data.path" and "bucket 'no-such-bucket-here' does not exist" in str(e.value)


def test_the_row_order_does_not_depend_on_the_read_order():
    """However Ray Data delivered the rows (files listed, blocks scheduled), sorting by id gives one order."""
    import numpy as np

    from elastic_train.data.ray_source import _order

    rng = np.random.default_rng(0)
    ids = rng.permutation(50)
    arrays = {"id": ids, "pixels": rng.random((50, 64)).astype(np.float32), "label": rng.integers(0, 10, 50)}
    cfg = job("data.features=[pixels]", "data.id_column=id", "data.feature_shape=[1,8,8]")
    x1, y1, i1 = _order(cfg, arrays)
    shuffled = rng.permutation(50)
    x2, y2, i2 = _order(cfg, {k: v[shuffled] for k, v in arrays.items()})
    assert x1.shape == (50, 1, 8, 8) and i1.tolist() == list(range(50))
    assert x1.equal(x2) and y1.equal(y2) and (i1 == i2).all()


def test_duplicate_ids_and_a_wrong_feature_shape_name_their_field():
    import numpy as np

    from elastic_train.data.ray_source import _order

    arrays = {"id": np.array([0, 1, 1]), "pixels": np.zeros((3, 4), np.float32), "label": np.zeros(3, np.int64)}
    with pytest.raises(ConfigError) as e:
        _order(job("data.features=[pixels]", "data.id_column=id"), arrays)
    assert e.value.field == "data.id_column"
    arrays["id"] = np.array([0, 1, 2])
    with pytest.raises(ConfigError) as e:
        _order(job("data.features=[pixels]", "data.id_column=id", "data.feature_shape=[3]"), arrays)
    assert e.value.field == "data.feature_shape"
