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
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "0", "0"], out.stdout
