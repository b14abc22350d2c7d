"""The run's log file: what the engine let go on purpose, each thing once, with why. Not the console.

A healthy run prints only the project's own lines (DESIGN invariant 10), and nothing is dropped in silence: an
``except`` that lets something go (a best-effort call, accounting, a cleanup) calls :func:`dropped`, which writes
one line, the first time only, to ``elastic_train.log`` in the run's local folder (beside the tracking spool:
the run's storage folder when that is a path, else ``<home>/results/<run>/``). The driver, each worker and the
Train controller attach that path in their own process (:func:`attach`), on their own node. A process that has
attached nothing (a notebook before its first run) writes the line to stderr instead: never nowhere.

What changes a run's result is not only logged here: the caller raises, or says it on the console or in the
summary (the goodput book lost: "unknown"; a checkpoint copy not sent: counted as unsent).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

LOG_FILE = "elastic_train.log"
LOGGER = "elastic_train.run"

_lock = threading.Lock()
_seen: set[str] = set()
_handler: logging.FileHandler | None = None


def _logger() -> logging.Logger:
    log = logging.getLogger(LOGGER)
    log.propagate = False  # never the console through the root logger; stderr only while nothing is attached
    log.setLevel(logging.INFO)
    return log


def attach(folder: str | Path | None) -> Path | None:
    """Write this process's run-log lines to ``folder/elastic_train.log`` (appending; the folder is made). A new
    run in the same process (a sweep trial in a reused actor, a notebook's next run) attaches its own folder.
    Returns the file, or None when ``folder`` is None or cannot be written (then lines go to stderr)."""
    global _handler
    if folder is None:
        return None
    path = Path(folder) / LOG_FILE
    with _lock:
        if _handler is not None and Path(_handler.baseFilename) == path.resolve():
            return path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(path, encoding="utf-8", delay=True)
        except OSError:
            return None
        handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s"))
        log = _logger()
        if _handler is not None:
            log.removeHandler(_handler)
            _handler.close()
        log.addHandler(handler)
        _handler = handler
        _seen.clear()  # a new run: its own first occurrences
    return path


def attached() -> Path | None:
    """The file this process writes its run-log lines to, if any."""
    return Path(_handler.baseFilename) if _handler is not None else None


def dropped(what: str, why: BaseException | str, *, once: str | None = None) -> bool:
    """Log that ``what`` was let go, and ``why``, once per key ``once`` (default: ``what``) per run in this
    process. Returns whether it was written now (False: said already)."""
    key = once or what
    with _lock:
        if key in _seen:
            return False
        _seen.add(key)
    reason = f"{type(why).__name__}: {str(why).strip().splitlines()[0][:300] if str(why).strip() else ''}" \
        if isinstance(why, BaseException) else why
    _logger().warning("dropped: %s (%s)", what, reason)
    return True
