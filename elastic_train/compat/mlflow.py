"""The process-wide MLflow environment defaults, and a tracking URI for one block (public APIs only).

The only module outside ``tracking/`` that names MLflow (``pyproject.toml`` allows it): ``tracking/`` imports it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# MLflow's own environment variables (public, mlflow.environment_variables) that we give another default in
# every process that logs on our behalf; a value the user set wins.
CONSOLE_DEFAULTS = {
    # "View run ... at: URL" lines: the run summary prints the run's address once (tracking/quiet.py)
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # "Downloading artifacts: 100%|...|" bars (carriage-returned) when a run reads a model or a tokenizer back
    # at its end: the console holds the project's lines only (issue 34, item 7)
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def set_console_defaults() -> None:
    """MLflow's console output off in this process and the ones it starts, unless the user set otherwise."""
    for key, value in CONSOLE_DEFAULTS.items():
        os.environ.setdefault(key, value)


@contextmanager
def use_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI set to ``uri`` inside the block, then restored *and* its env var.

    ``mlflow.set_tracking_uri`` also exports MLFLOW_TRACKING_URI; restoring with set_tracking_uri(get()) alone
    would leave the old default exported and redirect the next run, so the variable is put back as it was. Public
    API only (MLflow's private ``_use_tracking_uri`` did the same)."""
    import mlflow

    exported = os.environ.get("MLFLOW_TRACKING_URI")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if exported is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = exported
