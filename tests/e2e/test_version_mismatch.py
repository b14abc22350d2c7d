"""A driver whose Ray differs from its cluster's (issue 50, item 2): exit 2 with one line naming both versions and
the install line that matches the cluster, not Ray's own "Version mismatch" traceback.

Needs a second venv with another Ray: the oldest tested set's (``make test-oldest`` builds
``.venv-versions/oldest``) when this one is the newest, and the project's ``.venv`` when this one is another
(``make test-oldest`` and ``make test-versions`` run this test from theirs). ``$OTHER_RAY_VENV`` names one
explicitly. Without one the test is skipped, saying which it looked for.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import free_ports

pytestmark = [pytest.mark.e2e, pytest.mark.versions, pytest.mark.subprocess]

HEAD_TIMEOUT_S = 90


def ray_version(python: Path) -> str | None:
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('ray'))"],
                         capture_output=True, text=True, timeout=60, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def other_venv() -> tuple[Path, str] | None:
    """A venv whose Ray is not this process's: ($OTHER_RAY_VENV, the oldest set's, the project's .venv)."""
    from importlib.metadata import version

    ours = version("ray")
    candidates = [os.environ.get("OTHER_RAY_VENV"), ROOT / ".venv-versions/oldest", ROOT / ".venv"]
    for venv in (Path(c) for c in candidates if c):
        python = venv / "bin" / "python"
        if python.exists() and (theirs := ray_version(python)) and theirs != ours:
            return venv, theirs
    return None


@pytest.fixture(scope="module")
def other_head():
    """A one-node head of the other Ray (``ray start --head --block`` on a free port, its own temp dir)."""
    found = other_venv()
    if found is None:
        pytest.skip("no venv with another Ray ($OTHER_RAY_VENV, .venv-versions/oldest: make test-oldest builds it)")
    venv, version = found
    port, dashboard = free_ports(2)
    temp = Path(tempfile.mkdtemp(prefix="et-mm-", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    # token auth off on both sides: Ray 2.55 has none, and Ray 2.60 turns it on by default
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled",
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    log = (temp / "head.log").open("w")
    head = subprocess.Popen([str(venv / "bin" / "ray"), "start", "--head", "--block", f"--port={port}",
                             "--node-ip-address=127.0.0.1", "--num-cpus=1", "--include-dashboard=false",
                             f"--dashboard-port={dashboard}", f"--temp-dir={temp}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        probe = [str(venv / "bin" / "python"), "-c",
                 f"import ray; ray.init(address='127.0.0.1:{port}', logging_level='ERROR'); ray.shutdown()"]
        joined = subprocess.run(probe, env=env, capture_output=True, timeout=HEAD_TIMEOUT_S, check=False)
        assert joined.returncode == 0, (joined.stderr.decode()[-2000:], (temp / "head.log").read_text()[-2000:])
        yield f"127.0.0.1:{port}", version
    finally:
        os.killpg(head.pid, 15)
        try:
            head.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, 9)
            head.wait(10)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_driver_on_another_ray_than_its_cluster_exits_2_naming_both_and_the_install_line(other_head, tmp_path):
    from importlib.metadata import version

    address, theirs = other_head
    ours = version("ray")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env.update(ELASTIC_TRAIN_HOME=str(tmp_path), RAY_AUTH_MODE="disabled")
    out = subprocess.run([sys.executable, "-m", "jobs.train", "--config", "configs/digits.yaml", "--address", address,
                          "train.epochs=1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180,
                         check=False)
    console = out.stdout + out.stderr
    assert out.returncode == 2, console[-3000:]
    assert "Traceback" not in console, console[-3000:]
    errors = [line for line in console.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, console[-3000:]
    assert ours in errors[0] and theirs in errors[0], errors[0]
    assert re.search(rf"make install RAY_VERSION={re.escape(theirs)}\b", errors[0]), errors[0]
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())  # nothing trained
