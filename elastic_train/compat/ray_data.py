"""Ray Data knobs read under private names (checked on Ray 2.60.0)."""

from __future__ import annotations

import contextlib
import importlib
import math
import os
from collections.abc import Iterator

# Ray Data's Parquet reads list their files through a pool of ``FooterReader`` actors, each a new Python process,
# ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`` of them (32 by default) for every execution, whatever the file count.
# The env var is read when ``read_parquet`` builds the indexer, in the calling process.
PARQUET_FOOTER_ACTORS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
FOOTER_INDEXER_MODULE = "ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer"
RAY_DEFAULT_FOOTER_ACTORS = 32  # Ray's default: the ceiling kept for a large data set
FOOTERS_PER_ACTOR = 10  # Ray's footer batch (RAY_DATA_PARQUET_FOOTER_BATCH_SIZE): the files one actor call reads


def parquet_footer_actors(files: int) -> int:
    """As many footer readers as the files fill batches for: 1 for up to 10 files, Ray's 32 from 320."""
    return max(1, min(RAY_DEFAULT_FOOTER_ACTORS, math.ceil(files / FOOTERS_PER_ACTOR)))


@contextlib.contextmanager
def parquet_footer_readers(files: int) -> Iterator[None]:
    """Within: a ``read_parquet`` of ``files`` files starts :func:`parquet_footer_actors` footer readers, not 32.
    A value the user exported wins."""
    if PARQUET_FOOTER_ACTORS_ENV in os.environ:
        yield
        return
    with contextlib.suppress(ImportError):  # its module-level default is read at import: from the real environment
        importlib.import_module(FOOTER_INDEXER_MODULE)
    os.environ[PARQUET_FOOTER_ACTORS_ENV] = str(parquet_footer_actors(files))
    try:
        yield
    finally:
        os.environ.pop(PARQUET_FOOTER_ACTORS_ENV, None)
