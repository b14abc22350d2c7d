"""cluster.sim's bad input: one line, exit 2, before anything is made (python -m cluster.sim, a real process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import sim

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.subprocess


def _sim(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "cluster.sim", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)


def _one_error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.stderr, out.stderr
    return lines[0]


@pytest.mark.parametrize("hosts", ["0", "17"])
def test_a_host_count_out_of_range_is_refused(hosts):
    assert f"hosts={hosts}: need 1 to 16" in _one_error_line(_sim("--bridge", "etbad0", "up", hosts))


def test_a_bridge_name_in_use_is_refused():
    if sim.namespaces_supported() is not None:
        pytest.skip(f"needs root and iproute2: {sim.namespaces_supported()}")
    subprocess.run(["ip", "link", "add", "etbusy0", "type", "bridge"], check=True, timeout=10)
    try:
        line = _one_error_line(_sim("--bridge", "etbusy0", "up", "2"))
        assert "bridge='etbusy0' is in use" in line
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        assert "etbusy0-" not in listed  # nothing was made
    finally:
        subprocess.run(["ip", "link", "del", "etbusy0"], check=False, timeout=10)


def test_without_root_it_says_so():
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root (to drop it) and setpriv")
    line = _one_error_line(_sim("--bridge", "etnr0", "up", "2",
                                prefix=(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")))
    assert "needs root" in line


def test_commands_on_a_cluster_that_is_not_there_say_how_to_make_one(tmp_path):
    line = _one_error_line(_sim("--state", str(tmp_path), "kill", "1"))
    assert "no cluster in" in line and "cluster.sim up N" in line


def test_a_checkout_under_tmp_is_refused_at_once_with_what_to_do():
    """Every simulated host binds a folder of its own onto /tmp, so a checkout under /tmp (a fresh clone in /tmp/x)
    is invisible inside the hosts: start-head.sh exited 127 there (issue 51 item 10). `up` refuses it first, with
    one line; no root needed to see it. The checkout here is a copy of cluster/ in a folder under /tmp."""
    import tempfile

    clone = Path(tempfile.mkdtemp(prefix="et-clone-", dir="/tmp"))
    try:
        shutil.copytree(ROOT / "cluster", clone / "cluster")
        out = subprocess.run([sys.executable, "-m", "cluster.sim", "--bridge", "etclone0", "--state",
                              str(clone / "state"), "up", "2"], cwd=clone, capture_output=True, text=True,
                             timeout=60, check=False)
        line = _one_error_line(out)
        assert f"the checkout {clone}" in line and "under /tmp" in line and "outside /tmp" in line, line
        assert not (clone / "state").exists()  # refused before anything was made
    finally:
        shutil.rmtree(clone, ignore_errors=True)


def test_a_venv_or_state_folder_under_tmp_is_named_too(tmp_path):
    """The same for the venv the hosts run (its `ray`, its python) and the harness's state folder (each host's HOME
    and the jobs' shared folder); the hosts fixture asks the same question and skips with that line."""
    assert sim.invisible_in_hosts(root=Path("/work/x"), venv_bin=Path("/work/x/.venv/bin"), state="/var/tmp/s") is None
    venv = sim.invisible_in_hosts(root=Path("/work/x"), venv_bin=Path("/tmp/v/.venv/bin"), state="/var/tmp/s")
    assert venv is not None and "the venv /tmp/v/.venv" in venv and "outside /tmp" in venv
    state = sim.invisible_in_hosts(root=Path("/work/x"), venv_bin=Path("/work/x/.venv/bin"), state="/tmp/st")
    assert state is not None and "the state folder /tmp/st" in state
