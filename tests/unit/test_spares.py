"""Warm spares (train/spares.py): the environment that makes Train workers warm, and how a node's spares are found.

The end-to-end proof (a restarted worker group starting on spare processes made before the fault) is
tests/distributed/test_spares.py; these are the parts that need no Ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elastic_train.compat.ray_core import SETUP_HOOK_ENV
from elastic_train.config import JobConfig
from elastic_train.train.spares import MARKER_ENV, PRELOAD, local_workers, worker_env


def test_the_workers_get_the_preload_hook_and_a_marker_of_their_environment():
    env = worker_env(SETUP_HOOK_ENV, {"MLFLOW_TRACKING_USERNAME": "u"})
    assert env[SETUP_HOOK_ENV] == PRELOAD
    assert env[MARKER_ENV] == worker_env(SETUP_HOOK_ENV, {"MLFLOW_TRACKING_USERNAME": "u"})[MARKER_ENV]
    assert env[MARKER_ENV] != worker_env(SETUP_HOOK_ENV, {"MLFLOW_TRACKING_USERNAME": "v"})[MARKER_ENV]


def test_a_job_with_its_own_setup_hook_keeps_it():
    env = worker_env(SETUP_HOOK_ENV, {SETUP_HOOK_ENV: "users.own_hook"})
    assert SETUP_HOOK_ENV not in env and MARKER_ENV in env


def test_the_hook_is_importable_as_ray_loads_it():
    from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook_module

    assert load_and_execute_setup_hook_module(PRELOAD) is None  # Ray's own loader: None = it ran
    assert "torch" in sys.modules and "ray.train.torch" in sys.modules


@pytest.mark.parametrize("value, ok", [("auto", True), ("0", True), ("2", True), ("-1", False), ("many", False)])
def test_spare_workers_setting(value, ok):
    if ok:
        JobConfig.model_validate({"failure": {"spare_workers": value}})
    else:
        with pytest.raises(ValueError, match="spare_workers"):
            JobConfig.model_validate({"failure": {"spare_workers": value}})


def _process(env: dict[str, str], argv0: str) -> subprocess.Popen:
    # a real process whose command line and environment look like a Ray worker's
    return subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", argv0], env=env,
                            stdin=subprocess.PIPE)


def test_a_raylets_spares_are_this_jobs_idle_processes_made_for_this_environment():
    job, marker, raylet = "0a000000", "abc123def456", "4242"
    env = {"RAY_JOB_ID": job, MARKER_ENV: marker, "RAY_RAYLET_PID": raylet}
    spare = _process(env, "default_worker.py")
    busy = _process(env, "train.py")  # a Train worker at work (its title is ray::RayTrainWorker...)
    others = [_process({**env, "RAY_JOB_ID": "0b000000"}, "default_worker.py"),
              _process({**env, MARKER_ENV: "000000000000"}, "default_worker.py"),
              _process({**env, "RAY_RAYLET_PID": "4343"}, "default_worker.py")]  # another raylet, same machine
    try:  # Popen returns once exec is done: /proc shows each one's command line and environment
        assert local_workers(job, marker, raylet) == ([spare.pid], [busy.pid])
    finally:
        for p in [spare, busy, *others]:
            p.kill()
            p.wait()
    assert local_workers(job, marker, raylet) == ([], [])


def test_the_trainer_leaves_a_jobs_own_setup_hook_in_place(monkeypatch):
    from elastic_train.launch.trainer import spare_worker_env

    monkeypatch.delenv(SETUP_HOOK_ENV, raising=False)
    assert spare_worker_env({})[SETUP_HOOK_ENV] == PRELOAD
    monkeypatch.setenv(SETUP_HOOK_ENV, "users.own_hook")  # ray job submit --runtime-env-json with a hook
    assert SETUP_HOOK_ENV not in spare_worker_env({})


@pytest.mark.parametrize(("setting", "line"), [("auto", "spares: one per worker on each node from 60 s"),
                                               (2, "spares: 2 on each node from 60 s"), (0, None)])
def test_the_preflight_says_what_the_spares_cost(setting, line):
    from elastic_train.launch.preflight import NodeInfo, PreflightReport

    report = PreflightReport([NodeInfo("n", "127.0.0.1", 2, 0)], False, {"CPU": 1.0}, fit_workers=2,
                             requested=(2, 2), storage_path="/tmp", storage_shared=None, plans=[],
                             data={"train_samples": 1, "val_samples": 1}, model_parameters=1,
                             spare_workers=setting, spares_after_s=60.0)
    spares = [x for x in report.render().splitlines() if "spares:" in x]
    assert spares == ([] if line is None else [spares[0]]) and (line is None or line in spares[0])
    assert line is None or "GB of memory each" in spares[0]
    assert report.to_dict()["spare_workers"] == setting


def test_a_worker_that_imported_torch_before_ray_placed_it_uses_rays_thread_count():
    """A spare imports torch before Ray sets OMP_NUM_THREADS for the actor placed on it; the worker's warm-up then
    sets torch's intra-op threads to it (else one per core: other sums than a cold start; seen as another
    params_sha256 of the demo)."""
    code = ("import os, torch; before = torch.get_num_threads(); os.environ['OMP_NUM_THREADS'] = '1'; "
            "from elastic_train.train.warmup import match_ray_threads; match_ray_threads(); "
            "print(before, torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    before, after = map(int, out.stdout.split())
    assert after == 1 and before >= 1
