"""bench/gpu_ray.py --smoke: the GPU check's sequence on the CPU with gloo (one embedded Ray, real jobs.train runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def smoke(tmp_path: Path, parts: str, timeout: int) -> dict:
    out = tmp_path / "gpu_ray.json"
    proc = subprocess.run([sys.executable, "bench/gpu_ray.py", "--smoke", "--parts", parts, "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == result  # the JSON on stdout, the runs' consoles on stderr
    return result


@pytest.mark.slow
@pytest.mark.subprocess  # ~50 s here (one FSDP jobs.train run under Ray; the refusal takes no time)
def test_smoke_fsdp_on_one_worker_and_two_ranks_on_one_gpu_refused(tmp_path):
    c = smoke(tmp_path, "c", 300)["parts"]["c"]
    assert c["ok"] and c["fsdp"]["status"] == "FINISHED" and c["fsdp"]["steps"] == 10
    refusal = c["two_workers_one_gpu"]
    assert refusal["exit_code"] == 2 and len(refusal["stderr"]) == 1
    assert refusal["stderr"][0].startswith("error: scaling.resources_per_worker=") and "NCCL" in refusal["stderr"][0]


@pytest.mark.soak
@pytest.mark.long  # the whole sequence: 4-8 min here (five jobs.train runs; part d ran past 180 s at load 20)
def test_smoke_whole_sequence(tmp_path):
    r = smoke(tmp_path, "a,b,c,d", 1500)
    p = r["parts"]
    assert all(part["ok"] for part in p.values()), p
    assert p["a"]["engine_vs_plain_mfu_ratio"] > 0 and p["a"]["engine"]["steps"] == 20
    assert p["b"]["fault_fired"] and p["b"]["restarts"] == 1 and p["b"]["loss_bitwise"]  # the CPU: bitwise
    assert p["b"]["params_sha256"] == p["b"]["a_params_sha256"]
    assert p["d"]["tokens"]["status"] == "FINISHED" and p["d"]["ray_stream"]["status"] == "FINISHED"
    assert set(r["goals_met"]) >= {"a_mfu", "a_engine_vs_plain_mfu_ratio", "d_tokens_data_wait_share"}
