"""Pack what a bare GPU machine lacks to run the engine under Ray: wheels for it, Ray's repacked without Java.

    scripts/device-pack.sh                                # = make device-pack: cp312 manylinux x86_64 -> dist/device
    PYTHON_VERSION=3.11 scripts/device-pack.sh --out /tmp/pack --extra scikit-learn   # this machine's Python

The GPU machine (docs/gpu.md) has Python, torch (CUDA), numpy, pandas, pyarrow and tokenizers, and no network;
at most 64 MiB travel to it per run, the project tree included. It lacks Ray and what Ray Train / Tune / Data
and the engine import besides: :data:`PACKAGES`, each at the version pinned in constraints.txt. They are
downloaded as binary wheels for ``--python-version`` / ``--platform`` (``pip download --only-binary=:all:
--no-deps``: the list is explicit, so nothing the machine already has is pulled in), then Ray's wheel is
repacked without :data:`RAY_STRIP` (the parts a Python-only, dashboard-less Ray Train / Tune / Data run never
reads; its RECORD is rewritten to match, so pip installs it as any wheel). Downloads are kept in
``<out>-cache/py<version>``: a rerun needs no network once everything is there.

Invariants: the output folder holds only ``wheels/*.whl`` and ``manifest.json`` (file, bytes, sha256 of each
wheel; what was stripped; the totals), and the wheels plus the project tree as the device tool carries it
(tracked and untracked-not-ignored files) stay under ``--budget-mib``. Exit 0 packed; 2 when a wheel could not be
downloaded (named, with pip's last line) or the total is over the budget (by how much); nothing else is written
then but the cache.

On the device: ``pip install --no-index --no-deps --target DIR wheels/*.whl`` and ``PYTHONPATH=DIR``
(bench/gpu_ray.py does it).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024

# What the GPU machine lacks, by distribution name as constraints.txt spells it. Ray's own requirements (core,
# and the train / tune / data extras) less what the machine has (numpy, pandas, pyarrow) and less ray[default]
# (dashboard, metrics exporters: a local Ray starts without them); then the engine's own (pydantic, PyYAML).
# tests/unit/test_device_pack.py checks this against ray's METADATA; the long test installs it with --no-index.
PACKAGES = (
    "ray",
    # ray core
    "click", "filelock", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "attrs",
    "msgpack", "packaging", "protobuf", "PyYAML", "requests", "urllib3", "idna", "charset-normalizer", "certifi",
    # ray[train,tune,data]
    "fsspec", "tensorboardX", "pydantic", "pydantic_core", "annotated-types", "typing_extensions",
    "typing-inspection",
)
# ray/jars: the Java worker (ray_dist.jar, 32 MB of the 79 MB cp312 wheel); ray/rllib: RL, which Tune only
# imports inside a try (registry._has_rllib_trainable); ray/dashboard/client/build: the dashboard's web UI,
# served only by a dashboard that needs ray[default]'s aiohttp, which is not packed.
RAY_STRIP = ("ray/jars/", "ray/rllib/", "ray/dashboard/client/build/")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python-version", default=os.environ.get("PYTHON_VERSION", "3.12"),
                   help="the target's Python, e.g. 3.12 (default: $PYTHON_VERSION, else 3.12)")
    p.add_argument("--platform", default=os.environ.get("PLATFORM", "manylinux2014_x86_64"),
                   help="pip's --platform tag(s), comma-separated, e.g. manylinux_2_28_x86_64,manylinux2014_x86_64 "
                   "(default: $PLATFORM, else manylinux2014_x86_64)")
    p.add_argument("--out", default=str(ROOT / "dist" / "device"), help="output folder (default dist/device)")
    p.add_argument("--extra", action="append", default=[],
                   help="another distribution to pack (pinned by constraints.txt), e.g. scikit-learn for digits")
    p.add_argument("--budget-mib", type=float, default=float(os.environ.get("BUDGET_MIB", 60)),
                   help="wheels + project tree must stay under this (default 60; the device carries 64)")
    return p.parse_args(argv)


def pins(constraints: Path = ROOT / "constraints.txt") -> dict[str, str]:
    """``{normalized name: version}`` from constraints.txt."""
    out = {}
    for line in constraints.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[normalize(name)] = version.strip()
    return out


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path | str) -> str:
    """The normalized distribution name of a wheel file."""
    return normalize(Path(path).name.split("-", 1)[0])


# ---------------------------------------------------------------------------------------------- repack


def repack(src: Path, dst: Path, strip: tuple[str, ...]) -> dict[str, int]:
    """Copy wheel ``src`` to ``dst`` without the members under any ``strip`` prefix; RECORD drops their lines
    (the other members and their hashes are unchanged, so the wheel stays valid). Returns counts and bytes."""
    removed, removed_bytes = 0, 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
        records = [n for n in zin.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")]
        if len(records) != 1:
            raise ValueError(f"{src.name}: expected one top-level .dist-info/RECORD, found {len(records)}")
        for info in zin.infolist():
            if info.filename.startswith(strip):
                removed += 1
                removed_bytes += info.file_size
                continue
            data = zin.read(info)
            if info.filename == records[0]:
                data = _strip_record(data, strip)
            zout.writestr(info, data)  # the original ZipInfo: permissions (raylet, gcs_server: 0755) are kept
    return {"removed_files": removed, "removed_bytes": removed_bytes}


def _strip_record(data: bytes, strip: tuple[str, ...]) -> bytes:
    rows = [r for r in csv.reader(io.StringIO(data.decode())) if r and not r[0].startswith(strip)]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    return buf.getvalue().encode()


# ---------------------------------------------------------------------------------------------- download


def download(names: list[str], versions: dict[str, str], cache: Path, python_version: str,
             platform: str) -> list[str]:
    """Download the wheels ``cache`` lacks; returns the requirements still missing afterwards."""
    cache.mkdir(parents=True, exist_ok=True)
    reqs = [f"{n}=={versions[normalize(n)]}" for n in names]
    have = {(wheel_name(p), p.name.split("-")[1]) for p in cache.glob("*.whl")}
    todo = [r for r in reqs if (normalize(r.split("==")[0]), r.split("==")[1]) not in have]
    if todo:
        platforms = [a for p in platform.split(",") for a in ("--platform", p)]
        cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", *platforms, "--python-version", python_version, "--dest", str(cache), *todo]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False,
                              env={**os.environ, "PIP_CONSTRAINT": ""})
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"device-pack: pip download: {tail}", file=sys.stderr)
    have = {(wheel_name(p), p.name.split("-")[1]) for p in cache.glob("*.whl")}
    return [r for r in reqs if (normalize(r.split("==")[0]), r.split("==")[1]) not in have]


def tree_bytes(root: Path = ROOT) -> int:
    """The project tree as the device tool carries it: tracked files and untracked files git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True, timeout=60).stdout.decode()
    return sum((root / p).stat().st_size for p in set(out.split("\0")) if p and (root / p).is_file())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    versions = pins()
    names = list(PACKAGES) + list(a.extra)
    unpinned = [n for n in names if normalize(n) not in versions]
    if unpinned:
        print(f"device-pack: not pinned in constraints.txt: {', '.join(unpinned)}", file=sys.stderr)
        return 2
    out = Path(a.out).resolve()
    cache = out.with_name(out.name + "-cache") / f"py{a.python_version}-{a.platform.replace(',', '+')}"
    missing = download(names, versions, cache, a.python_version, a.platform)
    if missing:
        print(f"device-pack: missing {len(missing)} wheel(s) for Python {a.python_version} {a.platform} "
              f"(no network?): {', '.join(missing)}", file=sys.stderr)
        return 2
    wanted = {(normalize(n), versions[normalize(n)]) for n in names}
    sources = [p for p in sorted(cache.glob("*.whl")) if (wheel_name(p), p.name.split("-")[1]) in wanted]
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "wheels").mkdir(parents=True)
    stripped: dict[str, int] = {}
    for src in sources:
        dst = staging / "wheels" / src.name
        if wheel_name(src) == "ray":
            stripped = repack(src, dst, RAY_STRIP)
        else:
            shutil.copy2(src, dst)
    wheels = [{"file": p.name, "bytes": p.stat().st_size, "sha256": sha256(p)}
              for p in sorted((staging / "wheels").glob("*.whl"))]
    wheel_total, tree = sum(w["bytes"] for w in wheels), tree_bytes()
    total = wheel_total + tree
    manifest = {"python_version": a.python_version, "platform": a.platform, "wheels": wheels,
                "ray_stripped": {"prefixes": list(RAY_STRIP), **stripped},
                "wheel_bytes": wheel_total, "tree_bytes": tree, "total_bytes": total,
                "budget_bytes": int(a.budget_mib * MIB)}
    if total > a.budget_mib * MIB:
        shutil.rmtree(staging, ignore_errors=True)
        print(f"device-pack: {total / MIB:.1f} MiB (wheels {wheel_total / MIB:.1f} + tree {tree / MIB:.1f}) is "
              f"{(total - a.budget_mib * MIB) / MIB:.1f} MiB over --budget-mib {a.budget_mib:g}", file=sys.stderr)
        return 2
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    print(f"device-pack: {len(wheels)} wheels in {out / 'wheels'}: {wheel_total / MIB:.1f} MiB + project tree "
          f"{tree / MIB:.1f} MiB = {total / MIB:.1f} MiB of {a.budget_mib:g} (Ray without "
          f"{', '.join(RAY_STRIP)}: {stripped.get('removed_bytes', 0) / MIB:.1f} MiB unpacked less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
