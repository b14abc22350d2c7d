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
