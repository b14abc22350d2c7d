"""A Ray worker trains at niceness 0, not Ray's 15 (train/priority.normal_priority)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import os, threading
os.setpriority(os.PRIO_PROCESS, 0, 15)  # as the raylet starts a worker
ready, done = threading.Event(), threading.Event()
tid = []
def other():
    tid.append(threading.get_native_id()); ready.set(); done.wait()
t = threading.Thread(target=other); t.start(); ready.wait()
from elastic_train.train.worker import normal_priority
normal_priority()
later = []
t2 = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0))); t2.start(); t2.join()
print(os.getpriority(os.PRIO_PROCESS, 0), os.getpriority(os.PRIO_PROCESS, tid[0]), later[0])
done.set(); t.join()
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                    reason="per-thread niceness is Linux's; lowering it needs root (CAP_SYS_NICE)")
def test_every_thread_of_a_nice_15_worker_goes_back_to_0_and_new_threads_inherit_it():
    assert run_child(CHILD) == ["0", "0", "0"]


def run_child(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter with the project on its path; its stdout's words."""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


WARM_CHILD = r"""
import os, sys, threading
os.setpriority(os.PRIO_PROCESS, 0, 15)  # as the raylet starts a worker
from elastic_train.train.warmup import WorkerWarmup
assert "torch._dynamo" not in sys.modules and "elastic_train.train.worker" not in sys.modules
WorkerWarmup().after_init_train_context()  # what Ray Train calls on each worker before the process group
nice = os.getpriority(os.PRIO_PROCESS, 0)  # left at Ray's 15: Ray Train's helpers start meanwhile
warm = next(t for t in threading.enumerate() if t.name == "elastic-train-warmup")
warm.join(timeout=120)
print(nice, "torch._dynamo" in sys.modules, "elastic_train.train.worker" in sys.modules)
"""


@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="niceness as Linux keeps it")
def test_the_worker_warmup_imports_what_the_training_function_needs_in_a_thread_at_rays_niceness():
    assert run_child(WARM_CHILD) == ["15", "True", "True"]


def test_a_warmup_import_that_fails_stops_quietly_and_says_what_it_imported():
    from elastic_train.train.warmup import warm_imports

    assert warm_imports(("json", "elastic_train.no_such_module", "csv")) == ["json"]


def test_every_run_gives_ray_train_the_worker_warmup_and_none_with_the_switch_off(tmp_path, monkeypatch):
    import time
    import types

    from elastic_train import config
    from elastic_train.compat import features
    from elastic_train.launch.trainer import build_trainer
    from elastic_train.train.warmup import WorkerWarmup

    cfg = config.compose({}, config.parse_overrides([]))
    ctx = types.SimpleNamespace(cfg=cfg, run_name="warm", storage_path=str(tmp_path), use_gpu=False, tracking=None,
                                fault=None, started=time.time(), embedded_ray=False)
    monkeypatch.setenv(features.SWITCH_ENV, "on")
    assert WorkerWarmup in [type(c) for c in build_trainer(ctx).run_config.callbacks]
    monkeypatch.setenv(features.SWITCH_ENV, "off")
    assert build_trainer(ctx).run_config.callbacks == []  # Ray Train's public path alone


def test_an_embedded_ray_starts_its_workers_at_niceness_0_through_rays_own_setting(monkeypatch):
    """Ray's public RAY_worker_niceness replaced the controller callback that re-niced itself; a value the user
    exported wins."""
    from elastic_train.launch.context import embedded_ray_env

    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    embedded_ray_env()
    assert os.environ["RAY_worker_niceness"] == "0"
    monkeypatch.setenv("RAY_worker_niceness", "5")
    embedded_ray_env()
    assert os.environ["RAY_worker_niceness"] == "5"
