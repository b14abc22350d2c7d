"""The Parquet footer-reader pool sized to the file count, through Ray Data's own setting (compat/ray_data.py)."""

import os

from elastic_train.compat import ray_data
from elastic_train.compat.ray_data import (
    PARQUET_FOOTER_ACTORS_ENV,
    export_parquet_footer_readers,
    parquet_footer_actors,
)


def test_the_pool_is_one_reader_per_ten_files_between_one_and_rays_32():
    assert [parquet_footer_actors(n) for n in (0, 1, 10, 11, 95, 320, 10_000)] == [1, 1, 1, 2, 10, 32, 32]


def test_each_read_exports_its_size_and_a_users_own_value_wins(monkeypatch):
    monkeypatch.delenv(PARQUET_FOOTER_ACTORS_ENV, raising=False)
    monkeypatch.setattr(ray_data, "_USERS", None)
    export_parquet_footer_readers(4)
    assert os.environ[PARQUET_FOOTER_ACTORS_ENV] == "1"
    export_parquet_footer_readers(95)  # the next read, of more files: its own size, exported
    assert os.environ[PARQUET_FOOTER_ACTORS_ENV] == "10"
    monkeypatch.setenv(PARQUET_FOOTER_ACTORS_ENV, "7")
    monkeypatch.setattr(ray_data, "_USERS", "7")  # exported before the process started
    export_parquet_footer_readers(4)
    assert os.environ[PARQUET_FOOTER_ACTORS_ENV] == "7"
