"""A tracking backend on plain files: no server, no MLflow, nothing to install or keep running.

Layout under the root folder (``tracking.uri``, default ``<home>/tracking``)::

    <experiment>/<run_id>/run.json       name, kind, parent_run_id, status, start/end time, tags, params
    <experiment>/<run_id>/metrics.jsonl  one line per metric value: key, value, step, timestamp
    <experiment>/<run_id>/artifacts/     log_artifacts and log_checkpoint copy folders here
    <experiment>/<run_id>/model/         model.pt (``torch.save`` of the module) and metadata.json
    .registry/<name>/<version>/          ``models:/NAME/VERSION``: a copy of the model folder it registered

The driver and rank 0 write the same run from different processes (often different hosts on a shared
folder), so every write is one of two kinds that cannot lose another's: a metric line is a single
``write()`` to a file opened with O_APPEND; run.json is read, changed and replaced atomically (tmp file +
``os.replace``) while holding an ``flock`` on the run's lock file. Writes are synchronous: lines are small.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from elastic_train.files import write_json_atomically
from tracking.base import ChildRun, TrackingSpec, TrackingUnavailable
from tracking.runs import KIND_TAG, RUN_NAME_TAG, STORAGE_TAG, environment_params, storage_matches

log = logging.getLogger(__name__)
RUN_FILE, METRICS_FILE, LOCK_FILE = "run.json", "metrics.jsonl", ".lock"


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``folder``'s lock file: read-modify-write of its JSON is then safe."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK_FILE, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` atomically: readers see the old file or the new one, never half of one."""
    write_json_atomically(path, data)


def update_run(run_dir: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``change`` to run.json under the run's lock (two writers' tags and params both survive)."""
    with locked(run_dir):
        path = run_dir / RUN_FILE
        run = json.loads(path.read_text()) if path.exists() else {"tags": {}, "params": {}}
        change(run)
        write_json(path, run)
    return run


def read_metrics(run_dir: Path) -> Iterator[dict[str, Any]]:
    """The run's metric lines; a line a crashed writer left half-written is skipped, not fatal."""
    try:
        with open(run_dir / METRICS_FILE) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        return


def last_logged_step(run_dir: Path, key: str = "train_loss") -> int:
    return max((m["step"] for m in read_metrics(run_dir) if m.get("key") == key), default=-1)


def copy_into(src: str | Path, dest: Path) -> None:
    """Copy a folder's contents (or one file) into ``dest``, merging with what is there."""
    src = Path(src)
    if src.is_dir():
        shutil.copytree(src, dest, dirs_exist_ok=True)
    else:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / src.name)


def save_model(run_dir: Path, run_id: str, model: Any, metadata: dict[str, Any] | None) -> Path:
    """``torch.save`` the whole module (no code to rebuild it from) next to its metadata."""
    import torch

    folder = run_dir / "model"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.cpu().eval(), folder / "model.pt")
    write_json(folder / "metadata.json", {**(metadata or {}), "run_id": run_id})
    return folder


class JsonlTracker:
    """A process's :class:`~tracking.base.Tracker` on a jsonl run; every call is written before it returns."""

    def __init__(self, spec: TrackingSpec):
        self.spec = spec
        self.run_dir = Path(spec.uri) / spec.experiment_id / spec.run_id
        self.sent = 0
        self._floor = -1  # unless_logged metrics at steps <= this are dropped (skip_logged_steps)

    def skip_logged_steps(self, fallback: int) -> None:
        try:
            self._floor = last_logged_step(self.run_dir)
        except Exception:  # an unreadable folder: the caller's own record stands in
            self._floor = fallback

    def log_params(self, params: dict[str, Any]) -> None:
        def add(run: dict[str, Any]) -> None:  # params are immutable (as in MLflow): the first value stays
            for k, v in params.items():
                run["params"].setdefault(str(k), v if isinstance(v, str) else json.dumps(v, default=str))

        update_run(self.run_dir, add)
        self.sent += len(params)

    def log_metrics(self, metrics: dict[str, float], step: int, *, unless_logged: bool = False) -> None:
        if unless_logged and step <= self._floor:
            return
        ts = int(time.time() * 1000)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / METRICS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for k, v in metrics.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and v == v:  # numbers, not NaN
                    line = json.dumps({"key": k, "value": float(v), "step": int(step), "timestamp": ts})
                    os.write(fd, (line + "\n").encode())  # one write per line: O_APPEND keeps lines whole
                    self.sent += 1
        finally:
            os.close(fd)

    def set_tags(self, tags: dict[str, Any]) -> None:
        update_run(self.run_dir, lambda run: run["tags"].update({str(k): str(v) for k, v in tags.items()}))
        self.sent += len(tags)

    def log_checkpoint(self, path: str, artifact_path: str) -> None:
        copy_into(path, self.run_dir / "artifacts" / artifact_path)

    def log_model(self, model: Any, **kwargs: Any) -> Any:
        save_model(self.run_dir, self.spec.run_id, model, kwargs.get("metadata"))
        return {"model_uri": f"runs:/{self.spec.run_id}/model"}

    def close(self, timeout_s: float = 30.0) -> dict[str, Any]:
        return {"sent": self.sent, "unsent": 0, "spool_path": None}  # nothing is ever buffered


class JsonlBackend:
    """The driver's side of a jsonl store. No checkpoint copies: checkpoints stay in the run's storage."""

    name = "jsonl"

    def __init__(self, uri: str | None, home: Path):
        folder = uri.removeprefix("file://") if uri else Path(home) / "tracking"
        self.root = Path(folder).expanduser().resolve()  # absolute: workers run in another directory
        self.uri = str(self.root)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrackingUnavailable(f"cannot create {self.root} ({e})") from None
        if not os.access(self.root, os.W_OK):
            raise TrackingUnavailable(f"{self.root} is not writable")

    def start_run(self, experiment: str, run_name: str, *, kind: str, spool_path: Path,
                  parent_run_id: str | None = None, system_metrics: bool = False,
                  log_every_steps: int = 10, storage: str | None = None) -> tuple[TrackingSpec, bool]:
        exp_id = experiment.replace("/", "_").replace(os.sep, "_") or "default"
        with locked(self.root / exp_id):  # two drivers starting the same name make one run
            found = [r for r in self._runs(exp_id)
                     if r["name"] == run_name and r.get("parent_run_id") == parent_run_id
                     and storage_matches(r.get("tags", {}).get(STORAGE_TAG), storage)]
            if found:  # the oldest, as MLflow's search does; it runs again
                run_id = min(found, key=lambda r: r["start_time"])["run_id"]
                update_run(self.root / exp_id / run_id, lambda r: r.update(status="RUNNING", end_time=None))
            else:
                run_id = uuid.uuid4().hex
                new = {"run_id": run_id, "name": run_name, "kind": kind, "parent_run_id": parent_run_id,
                       "status": "RUNNING", "start_time": int(time.time() * 1000), "end_time": None,
                       "tags": {RUN_NAME_TAG: run_name, KIND_TAG: kind,
                                **({STORAGE_TAG: storage} if storage is not None else {})}, "params": {}}
                update_run(self.root / exp_id / run_id, lambda run: run.update(new))
        spec = TrackingSpec(backend=self.name, uri=self.uri, run_id=run_id, experiment_id=exp_id,
                            spool_path=str(spool_path), system_metrics=system_metrics,
                            log_every_steps=log_every_steps)
        return spec, bool(found)

    def writer(self, spec: TrackingSpec) -> JsonlTracker:
        return JsonlTracker(spec)

    def logged_params(self, spec: TrackingSpec) -> set[str]:
        return set(self._run(spec).get("params", {}))

    def last_logged_step(self, spec: TrackingSpec) -> int:
        return last_logged_step(self._dir(spec))

    def end_run(self, spec: TrackingSpec, status: str) -> None:
        update_run(self._dir(spec), lambda run: run.update(status=status, end_time=int(time.time() * 1000)))

    def log_artifacts(self, spec: TrackingSpec, local_dir: str | Path,
                      artifact_path: str | None = None) -> None:
        copy_into(local_dir, self._dir(spec) / "artifacts" / (artifact_path or ""))

    def log_model(self, spec: TrackingSpec, model: Any, input_example: Any, register_as: str | None,
                  metadata: dict[str, Any], extra_files: list[str] | None = None) -> dict[str, Any]:
        """Save the module (and ``extra_files``, in its ``extra_files/``) into the run; ``register_as`` also
        copies it in as the name's next version."""
        saved = save_model(self._dir(spec), spec.run_id, model, metadata)
        shutil.rmtree(saved / "extra_files", ignore_errors=True)  # this model's files, not an earlier one's
        if extra_files:
            (saved / "extra_files").mkdir()
            for f in extra_files:
                shutil.copy2(f, saved / "extra_files" / Path(f).name)
        out = {"model_uri": f"runs:/{spec.run_id}/model"}
        if register_as:  # a copy: a version must not change when the run logs its model again
            folder = self.root / ".registry" / register_as
            with locked(folder):
                version = 1 + max((int(p.name) for p in folder.iterdir() if p.name.isdigit()), default=0)
                shutil.copytree(saved, folder / str(version))
            out["registered_model"] = f"models:/{register_as}/{version}"
        return out

    def load_model(self, model_uri: str) -> tuple[Any, dict[str, Any]]:
        """``(module, metadata)`` of a model folder, ``runs:/RUN_ID/model`` or ``models:/NAME/VERSION``."""
        import torch

        folder = self._model_folder(model_uri)
        model = torch.load(folder / "model.pt", map_location="cpu", weights_only=False)  # a whole module
        metadata = json.loads((folder / "metadata.json").read_text())
        extra = {p.name: p.read_text() for p in sorted((folder / "extra_files").glob("*")) if p.is_file()}
        return model, metadata | {"run_id": metadata.get("run_id") or folder.parent.name, "extra_files": extra}

    def child_runs(self, parent: TrackingSpec) -> list[ChildRun]:
        return [ChildRun(r["name"], r["run_id"], r["status"])
                for r in self._runs(parent.experiment_id) if r.get("parent_run_id") == parent.run_id]

    def checkpoint_copier(self, spec: TrackingSpec, policy: list[str], score: str, mode: str) -> Any | None:
        return None  # checkpoints stay in the run's storage folder only: a second copy would just cost disk

    def environment_params(self) -> dict[str, str]:
        return environment_params()

    def log_dataset(self, spec: TrackingSpec, info: dict[str, Any]) -> None:
        """The run's data source under ``inputs`` in its run file (one entry per digest)."""
        def add(run: dict[str, Any]) -> None:
            inputs = [i for i in run.get("inputs", []) if i.get("digest") != info.get("digest")]
            run["inputs"] = [*inputs, info]

        update_run(self._dir(spec), add)

    # ------------------------------------------------------------------------------ helpers
    def _dir(self, spec: TrackingSpec) -> Path:
        return self.root / spec.experiment_id / spec.run_id

    def _run(self, spec: TrackingSpec) -> dict[str, Any]:
        return json.loads((self._dir(spec) / RUN_FILE).read_text())

    def _runs(self, exp_id: str) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / exp_id).glob(f"*/{RUN_FILE}"))]

    def _model_folder(self, model_uri: str) -> Path:
        if model_uri.startswith("models:/"):
            return self.root / ".registry" / model_uri.removeprefix("models:/")
        if model_uri.startswith("runs:/"):
            run_id, _, sub = model_uri.removeprefix("runs:/").partition("/")
            found = sorted(self.root.glob(f"*/{run_id}/{sub or 'model'}"))
            if not found:
                raise FileNotFoundError(f"no run {run_id} with a model under {self.root}")
            return found[0]
        return Path(model_uri.removeprefix("file://")).expanduser().resolve()
