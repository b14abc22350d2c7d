"""Files replaced atomically: a reader (or a restarted run) sees the old file or the new one, never half of one.

One helper for every writer that must not leave a partial file behind a crash: checkpoint parts and their
``meta.json`` (train/state.py, train/strategy.py), fault markers (train/faults.py), a token folder's index
(data/prepare.py), the jsonl tracking store (tracking/jsonl.py) and the jobs' ``--summary-json`` (jobs/_cli.py).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def replace_atomically(path: str | Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` to a temporary name of its own beside ``path`` (unique per call: two writers never share
    one), then rename it over ``path``. On failure the temporary file is removed and ``path`` is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomically(path: str | Path, text: str) -> None:
    replace_atomically(path, lambda tmp: tmp.write_text(text))


def write_json_atomically(path: str | Path, data: Any, indent: int | None = 1) -> None:
    write_text_atomically(path, json.dumps(data, indent=indent, default=str) + "\n")
