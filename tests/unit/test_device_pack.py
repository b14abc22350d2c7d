"""scripts/device_pack.py: the repack keeps a wheel installable (fast, no network), and (long) the packed wheels
alone, installed with --no-index into a fresh venv beside the machine's base, run the demo and a two-trial sweep."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("device_pack", ROOT / "scripts" / "device_pack.py")
device_pack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_pack)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def fake_wheel(path: Path) -> None:
    """A minimal valid wheel of distribution ``fakepkg`` with a Java jar and an executable, RECORD complete."""
    files = {
        "fakepkg/__init__.py": b"VALUE = 42\n",
        "fakepkg/bin/tool": b"#!/bin/sh\necho tool\n",
        "fakepkg/jars/big.jar": b"\0" * 4096,
        "fakepkg/jars/more/other.jar": b"\1" * 100,
        "fakepkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n",
        "fakepkg-1.0.dist-info/WHEEL":
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    for name, data in files.items():
        w.writerow([name, _digest(data), len(data)])
    w.writerow(["fakepkg-1.0.dist-info/RECORD", "", ""])
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100755 if name.endswith("tool") else 0o100644) << 16
            z.writestr(info, data)
        z.writestr("fakepkg-1.0.dist-info/RECORD", buf.getvalue())


@pytest.mark.subprocess  # pip install
def test_repack_drops_the_jars_keeps_record_consistent_and_installs(tmp_path):
    """~3 s (one pip install of a tiny local wheel)."""
    src, out = tmp_path / "src" / "fakepkg-1.0-py3-none-any.whl", tmp_path / "out"
    src.parent.mkdir()
    out.mkdir()
    fake_wheel(src)
    dst = out / src.name
    counts = device_pack.repack(src, dst, ("fakepkg/jars/",))
    assert counts == {"removed_files": 2, "removed_bytes": 4196}
    with zipfile.ZipFile(dst) as z:
        names = set(z.namelist())
        assert not any(n.startswith("fakepkg/jars/") for n in names)
        rows = list(csv.reader(io.StringIO(z.read("fakepkg-1.0.dist-info/RECORD").decode())))
        assert {r[0] for r in rows} == names  # every member listed, nothing listed that is gone
        for name, digest, size in rows:
            if digest:
                assert digest == _digest(z.read(name)) and int(size) == len(z.read(name)), name
        assert z.getinfo("fakepkg/bin/tool").external_attr >> 16 == 0o100755
    target = tmp_path / "target"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
                           "--disable-pip-version-check", "--target", str(target), str(dst)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (target / "fakepkg" / "__init__.py").read_text() == "VALUE = 42\n"
    assert not (target / "fakepkg" / "jars").exists()
    assert os.access(target / "fakepkg" / "bin" / "tool", os.X_OK)


def test_packages_cover_rays_requirements_less_what_the_gpu_machine_has():
    """Ray's core and train/tune/data requirements are packed, or are on the GPU machine (numpy, pandas,
    pyarrow); everything packed is pinned in constraints.txt."""
    from importlib.metadata import requires

    on_machine = {"numpy", "pandas", "pyarrow"}
    needed = set()
    for req in requires("ray") or []:
        name, _, marker = req.partition(";")
        if "extra" in marker and not any(f'extra == "{e}"' in marker for e in ("train", "tune", "data")):
            continue
        needed.add(device_pack.normalize(name.split("<")[0].split(">")[0].split("=")[0].split("!")[0].strip()))
    packed = {device_pack.normalize(n) for n in device_pack.PACKAGES}
    assert needed - packed - on_machine == set()
    pins = device_pack.pins()
    assert all(device_pack.normalize(n) in pins for n in device_pack.PACKAGES)


@pytest.mark.subprocess  # the packer, pip download
def test_pack_exits_2_naming_what_it_could_not_download(tmp_path):
    """No network (an unreachable index): exit 2, naming the missing wheels. ~2 s."""
    env = {**os.environ, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_INDEX": "", "PIP_FIND_LINKS": "",
           "PIP_EXTRA_INDEX_URL": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_pack.py"), "--out", str(tmp_path / "p"),
                           "--python-version", "3.9"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "missing" in proc.stderr and "ray==" in proc.stderr
    assert not (tmp_path / "p").exists()


@pytest.mark.soak
@pytest.mark.long  # downloads ~80 MB of wheels and builds a venv: ~3-4 min here
def test_packed_wheels_alone_run_the_demo_and_a_two_trial_sweep(tmp_path):
    """The packer for this machine's Python; a fresh venv holding what the GPU machine has (torch, numpy,
    pandas, pyarrow, tokenizers) plus the packed wheels, installed with --no-index --no-deps; pip check; then
    the digits demo and a two-trial sweep (tracking.backend=jsonl) with the repacked Ray."""
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    pack = tmp_path / "pack"
    # digits reads scikit-learn's bundled CSV: packed here as an extra (the GPU check uses tokens instead)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_pack.py"), "--python-version", py,
                           "--out", str(pack), "--extra", "scikit-learn", "--extra", "scipy", "--extra", "joblib",
                           "--extra", "threadpoolctl", "--budget-mib", "400",
                           "--platform", "manylinux_2_28_x86_64,manylinux_2_27_x86_64,manylinux2014_x86_64"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((pack / "manifest.json").read_text())
    assert manifest["ray_stripped"]["removed_files"] > 0
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    vpy = str(venv / "bin" / "python")

    def pip(*args: str) -> None:
        p = subprocess.run([vpy, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                           text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]

    pins = device_pack.pins()
    pip("install", "--no-cache-dir", *(f"{n}=={pins[n]}" for n in ("torch", "numpy", "pandas", "pyarrow",
                                                                     "tokenizers")))
    pip("install", "--no-index", "--no-deps", *map(str, sorted((pack / "wheels").glob("*.whl"))))
    # every packed distribution has what it requires (the base's and the extras' own gaps are not ours)
    check = subprocess.run([vpy, "-m", "pip", "check"], capture_output=True, text=True, timeout=300).stdout
    packed = {device_pack.normalize(n) for n in device_pack.PACKAGES}
    assert [ln for ln in check.splitlines() if device_pack.normalize(ln.split(" ")[0]) in packed] == [], check
    probe = subprocess.run([vpy, "-c", "import ray, os; print(os.path.isdir(os.path.join(os.path.dirname("
                            "ray.__file__), 'jars')))"], capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe.stderr
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ELASTIC_TRAIN_HOME": str(tmp_path / "home")}
    env.pop("VIRTUAL_ENV", None)
    common = ["tracking.backend=jsonl", f"checkpoint.storage_path={tmp_path / 'results'}"]
    train = subprocess.run([vpy, "-m", "jobs.train", "--config", "configs/digits.yaml", "train.epochs=1",
                            "name=packed-demo", *common, "--summary-json", str(tmp_path / "train.json")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert train.returncode == 0, (train.stdout[-2000:], train.stderr[-3000:])
    assert json.loads((tmp_path / "train.json").read_text())["status"] == "FINISHED"
    sweep = subprocess.run([vpy, "-m", "jobs.sweep", "--config", "configs/sweep-digits.yaml", "sweep.num_samples=2",
                            "train.epochs=1", "scaling.num_workers=1", "name=packed-sweep", *common,
                            "--summary-json", str(tmp_path / "sweep.json")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert sweep.returncode == 0, (sweep.stdout[-2000:], sweep.stderr[-3000:])
    assert len(json.loads((tmp_path / "sweep.json").read_text())["trials"]) == 2


@pytest.mark.parametrize("overrides, refused", [
    (["scaling.num_workers=2", "scaling.resources_per_worker={CPU: 1, GPU: 0.5}"], True),
    (["scaling.num_workers=[1, 2]", "scaling.resources_per_worker={GPU: 0.5}", "scaling.use_gpu=true"], True),
    (["scaling.num_workers=1", "scaling.resources_per_worker={GPU: 0.5}"], False),
    (["scaling.num_workers=2", "scaling.resources_per_worker={GPU: 0.5}", "scaling.use_gpu=false"], False),
    (["scaling.num_workers=2", "scaling.resources_per_worker={GPU: 1}"], False),
])
def test_preflight_refuses_two_ranks_on_one_gpu(overrides, refused):
    """NCCL refuses two ranks on one device: the preflight says so before any worker starts (config only)."""
    from elastic_train.config import ConfigError, load
    from elastic_train.launch.preflight import check_gpu_share

    cfg = load(None, overrides)
    if refused:
        with pytest.raises(ConfigError, match=r"scaling\.resources_per_worker=.*NCCL refuses"):
            check_gpu_share(cfg)
    else:
        check_gpu_share(cfg)
