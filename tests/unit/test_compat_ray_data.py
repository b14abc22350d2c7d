"""The Parquet footer-reader pool sized to the file count (compat/ray_data.py)."""

import os

from elastic_train.compat.ray_data import PARQUET_FOOTER_ACTORS_ENV, parquet_footer_actors, parquet_footer_readers


def test_the_pool_is_one_reader_per_ten_files_between_one_and_rays_32():
    assert [parquet_footer_actors(n) for n in (0, 1, 10, 11, 95, 320, 10_000)] == [1, 1, 1, 2, 10, 32, 32]


def test_the_knob_is_set_only_within_and_a_users_own_value_wins(monkeypatch):
    monkeypatch.delenv(PARQUET_FOOTER_ACTORS_ENV, raising=False)
    with parquet_footer_readers(4):
        assert os.environ[PARQUET_FOOTER_ACTORS_ENV] == "1"
    assert PARQUET_FOOTER_ACTORS_ENV not in os.environ
    monkeypatch.setenv(PARQUET_FOOTER_ACTORS_ENV, "7")
    with parquet_footer_readers(4):
        assert os.environ[PARQUET_FOOTER_ACTORS_ENV] == "7"
    assert os.environ[PARQUET_FOOTER_ACTORS_ENV] == "7"


def test_rays_own_default_is_not_taken_from_the_value_set_within(monkeypatch):
    """The footer module reads its default at import: imported first under our value, every later read in the
    process (outside our reads) would get 1 actor."""
    import importlib
    import sys

    from elastic_train.compat.ray_data import FOOTER_INDEXER_MODULE, RAY_DEFAULT_FOOTER_ACTORS

    monkeypatch.delenv(PARQUET_FOOTER_ACTORS_ENV, raising=False)
    monkeypatch.delitem(sys.modules, FOOTER_INDEXER_MODULE, raising=False)
    with parquet_footer_readers(4):
        pass
    assert importlib.import_module(FOOTER_INDEXER_MODULE)._DEFAULT_NUM_ACTORS == RAY_DEFAULT_FOOTER_ACTORS
