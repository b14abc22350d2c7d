"""MLflow's INFO chatter off the console, in every process that imports MLflow on our behalf.

MLflow configures its ``mlflow`` logger when it is first imported, at ``$MLFLOW_LOGGING_LEVEL`` (default INFO),
with its own stderr handler: the driver then prints "Creating initial MLflow database tables..." when it creates
the sqlite store, and the rank-0 sender child (whose stderr Ray forwards to the driver) four lines about system
metrics. :func:`quiet_mlflow_logging` makes the default WARNING, so warnings and errors still reach the console;
an ``MLFLOW_LOGGING_LEVEL`` the user set wins. No MLflow import here: it is called before MLflow is imported.
"""

from __future__ import annotations

import logging
import os

from elastic_train.compat.mlflow import set_console_defaults

MLFLOW_LOGGING_LEVEL = "MLFLOW_LOGGING_LEVEL"  # read by MLflow itself (mlflow.utils.logging_utils)


def quiet_mlflow_logging() -> None:
    """``MLFLOW_LOGGING_LEVEL`` defaults to WARNING in this process (and the processes it starts); applied at once
    too, for an MLflow already imported. Idempotent. MLflow's "View run ... at: URL" stdout lines (printed when a
    run on a tracking server ends or gets a model) are off too: the run summary prints the run's address once."""
    set_console_defaults()  # no "View run ... at: URL" lines, no "Downloading artifacts" bars
    level = os.environ.setdefault(MLFLOW_LOGGING_LEVEL, "WARNING").upper()
    try:
        logging.getLogger("mlflow").setLevel(level)
    except ValueError:  # not a level name: MLflow's own import will complain about it; leave the logger as it is
        pass
    if _migrations_configure_logging() and level != "INFO" and level != "DEBUG":
        # MLflow before 3.7 runs logging.config.fileConfig(alembic.ini) each time it opens a SQL store: Alembic's
        # INFO lines ("Context impl SQLiteImpl.", every migration) on the console of the driver and of each
        # process that logs. fileConfig resets loggers and handlers, not Python's global threshold: INFO off.
        logging.disable(logging.INFO)


def _migrations_configure_logging() -> bool:
    """Whether the installed MLflow's schema migrations reconfigure logging (MLflow 3.5 and 3.6)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor = (int(p) for p in version("mlflow").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return False
    return (major, minor) < (3, 7)
