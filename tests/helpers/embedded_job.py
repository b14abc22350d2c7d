"""``jobs.train`` in a subprocess with its own embedded Ray of a chosen size (CPUs, object store), for tests that
need a Ray the session's shared one cannot be (e.g. a small object store)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import json, sys
import ray
spec = json.loads(sys.argv[1])
ray.init(address="local", num_cpus=spec["num_cpus"], object_store_memory=spec["object_store_memory"],
         include_dashboard=False, logging_level="ERROR")
from jobs import train
code = train.main(spec["argv"])
ray.shutdown()
sys.exit(code)
"""


def run_embedded(argv: list[str], *, num_cpus: int, object_store_memory: int, env: dict[str, str] | None = None,
                 timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``python -m jobs.train ARGV`` in a fresh process whose Ray has ``num_cpus`` and ``object_store_memory``;
    bounded by ``timeout_s`` (subprocess.TimeoutExpired past it)."""
    spec = json.dumps({"argv": argv, "num_cpus": num_cpus, "object_store_memory": object_store_memory})
    full_env = {**os.environ, **(env or {}), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    full_env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, "-c", _SCRIPT, spec], env=full_env, capture_output=True, text=True,
                          timeout=timeout_s, check=False)
