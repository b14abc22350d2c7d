"""Ray Data's Parquet footer readers, sized through Ray Data's own environment setting (public; no internal).

Ray 2.60's Parquet reads list their files through a pool of ``FooterReader`` actors, each a new Python process,
``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`` of them (32 by default) for every execution, whatever the file count (for
4 files: ~20 s of a streamed epoch on 2 cores). The setting is read when ``read_parquet`` builds its file indexer,
in the calling process, so the driver exports it before each read. Older Rays read footers without that pool, and
ignore the setting.
"""

from __future__ import annotations

import math
import os

PARQUET_FOOTER_ACTORS_ENV = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"
RAY_DEFAULT_FOOTER_ACTORS = 32  # Ray's default: the ceiling kept for a large data set
FOOTERS_PER_ACTOR = 10  # Ray's footer batch (RAY_DATA_PARQUET_FOOTER_BATCH_SIZE): the files one actor call reads

_USERS = os.environ.get(PARQUET_FOOTER_ACTORS_ENV)  # a value exported before this process started wins


def parquet_footer_actors(files: int) -> int:
    """As many footer readers as the files fill batches for: 1 for up to 10 files, Ray's 32 from 320."""
    return max(1, min(RAY_DEFAULT_FOOTER_ACTORS, math.ceil(files / FOOTERS_PER_ACTOR)))


def export_parquet_footer_readers(files: int) -> None:
    """Before a ``read_parquet`` of ``files`` files: export :func:`parquet_footer_actors` footer readers for it
    (and the reads after it), unless the user exported a value of their own."""
    if _USERS is None:
        os.environ[PARQUET_FOOTER_ACTORS_ENV] = str(parquet_footer_actors(files))
