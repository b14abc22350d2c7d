"""A run's folder in storage (local path, NFS, s3://, gs://) through one pyarrow filesystem interface.

Layout, as Ray Train writes it plus our one file::

    <storage_path>/<run name>/
        checkpoint_manager_snapshot.json   Ray: which checkpoints exist (resume reads this)
        checkpoint_000000123/              ours: meta.json, model.pt, train_state.pt, rng/
        elastic_train_config.json          the resolved job config (``--resume NAME`` starts from it)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.fs

from elastic_train.data import filesystems

if TYPE_CHECKING:
    from elastic_train.config import JobConfig

HOME_ENV = "ELASTIC_TRAIN_HOME"
CONFIG_FILE = "elastic_train_config.json"
SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"


def resolve_home() -> Path:
    """Where results and the embedded MLflow store live.

    ``$ELASTIC_TRAIN_HOME``; else the current directory, except under ``ray job submit``, whose working
    directory is a temporary unpacked copy: there ``~/elastic-train`` on the node running the driver.
    """
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV]).expanduser().resolve()
    if os.environ.get("RAY_JOB_SUBMISSION_ID") or "runtime_resources" in str(Path.cwd()):
        return (Path.home() / "elastic-train").resolve()
    return Path.cwd().resolve()


def resolve_storage(cfg: JobConfig, home: Path) -> str:
    """``checkpoint.storage_path`` made absolute (URIs such as s3:// and gs:// pass through)."""
    path = cfg.checkpoint.storage_path
    if path is None:
        return str(home / "results")
    if "://" in path:
        return path
    return str(Path(path).expanduser().resolve())


def default_run_name(config_path: str | None, now: float | None = None) -> str:
    stem = Path(config_path).stem if config_path else "run"
    return f"{stem}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}"


def ray_storage(storage_path: str) -> tuple[str, pyarrow.fs.FileSystem | None]:
    """``(storage_path, storage_filesystem)`` for Ray Train's RunConfig: object stores get our bounded,
    endpoint-aware filesystem (elastic_train.data.filesystems), whose requests ride out a short outage, and a
    path inside it."""
    if storage_path.startswith("s3://"):
        fs, path = filesystems.resolve(storage_path, durable=True)
        return path, fs
    return storage_path, None


def checkpoint_uri(storage_path: str, path: str) -> str:
    """A checkpoint path from Ray (inside the storage filesystem) as a URI others can open."""
    if storage_path.startswith("s3://") and "://" not in path:
        return f"s3://{path.lstrip('/')}"
    return path


class RunStorage:
    def __init__(self, storage_path: str, run_name: str):
        if "://" not in storage_path:
            storage_path = os.path.abspath(storage_path)
        self.fs, base = filesystems.resolve(storage_path)
        self.storage_path, self.run_name = storage_path, run_name
        self.root = f"{base.rstrip('/')}/{run_name}"

    def uri(self, rel: str = "") -> str:
        sep = "/" if rel else ""
        return f"{self.storage_path.rstrip('/')}/{self.run_name}{sep}{rel}"

    def _info(self, rel: str) -> pyarrow.fs.FileInfo:
        return self.fs.get_file_info(f"{self.root}/{rel}" if rel else self.root)

    def exists(self) -> bool:
        return self._info("").type == pyarrow.fs.FileType.Directory

    def has_checkpoints(self) -> bool:
        return self._info(SNAPSHOT_FILE).type == pyarrow.fs.FileType.File or bool(self.checkpoints())

    def clear(self) -> None:
        """Remove the run's folder (checkpoints and Ray Train's snapshot): the next fit starts it afresh."""
        if self.exists():
            self.fs.delete_dir(self.root)

    def remove(self, rel: str) -> None:
        """Delete the file ``rel`` if it is there."""
        if self._info(rel).type == pyarrow.fs.FileType.File:
            self.fs.delete_file(f"{self.root}/{rel}")

    def read_text(self, rel: str) -> str | None:
        if self._info(rel).type != pyarrow.fs.FileType.File:
            return None
        with self.fs.open_input_stream(f"{self.root}/{rel}") as f:
            return f.read().decode()

    def write_text(self, rel: str, text: str) -> None:
        self.fs.create_dir(self.root, recursive=True)
        with self.fs.open_output_stream(f"{self.root}/{rel}") as f:
            f.write(text.encode())

    def save_config(self, config: dict[str, Any]) -> None:
        self.write_text(CONFIG_FILE, json.dumps(config, indent=2))

    def load_config(self) -> dict[str, Any] | None:
        text = self.read_text(CONFIG_FILE)
        return json.loads(text) if text else None

    def checkpoints(self) -> list[str]:
        """Complete checkpoints (with meta.json), oldest first."""
        if not self.exists():
            return []
        selector = pyarrow.fs.FileSelector(self.root, recursive=False)
        names = sorted(
            i.base_name for i in self.fs.get_file_info(selector)
            if i.type == pyarrow.fs.FileType.Directory and i.base_name.startswith("checkpoint_")
        )
        return [n for n in names if self._info(f"{n}/meta.json").type == pyarrow.fs.FileType.File]

    def latest_checkpoint(self) -> tuple[str, dict[str, Any]] | None:
        """``(uri, meta)`` of the newest complete checkpoint, or None."""
        names = self.checkpoints()
        if not names:
            return None
        meta = json.loads(self.read_text(f"{names[-1]}/meta.json") or "{}")
        return self.uri(names[-1]), meta
