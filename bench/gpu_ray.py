"""The GPU path under Ray, in one command: jobs.train on one GPU worker beside a plain loop, a killed worker
resumed, FSDP, the two-ranks-on-one-GPU refusal, token shards and a streamed Ray Data set. JSON out.

    make device-pack                                             # here, with network: dist/device (~51 MiB)
    python bench/gpu_ray.py --wheels dist/device/wheels --out gpu_ray.json     # on a bare GPU box: < 8 min
    python bench/gpu_ray.py --smoke                              # the same sequence, tiny, on the CPU with gloo

With ``--wheels`` the packed wheels (scripts/device_pack.py) are installed first into a temporary folder
(``pip install --no-index --no-deps --target``) and the check runs again in a child with ``PYTHONPATH`` set to
it and the project (Ray workers inherit it); without, it uses the current environment. One embedded Ray
(``ray.init``) serves every part; each part is a real ``jobs.train`` run (``tracking.backend=jsonl``: no MLflow)
called in-process with its own storage, and is bounded: past its seconds the JSON so far is written with that
part marked ``timed out`` and the process exits 124. Parts:

    a  GPT-2 124M (smoke: a 2-layer GPT), bf16 + compile, one GPU worker: MFU, tokens/s and data wait against
       bench/gpu.py's plain loop, run before and after it (same shape, batches, steps); goals: ratio >= 0.98,
       MFU >= 50 %
    b  the same run with its worker killed (``ELASTIC_TRAIN_FAULT``, mode=exit) after a checkpoint: it restarts,
       restores on the GPU, and every logged train_loss after the restart matches part a's at the same step
       (bitwise on the CPU; on a GPU within ``--loss-rtol``: bf16 and atomics make GPU steps non-deterministic)
    c  FSDP with one GPU worker; then two workers on one GPU (GPU 0.5 each): refused by the preflight, exit 2
       and one line, before any worker starts
    d  the same GPT on token shards (jobs.prepare_tokens over the Python standard library's sources), and a
       CNN on a streamed Ray Data set (Parquet, ``data.ray_mode=stream``): data wait <= 1 % each (the Ray
       Data source has no language-model mode, hence the CNN)

Exit 0 when every part ran (goals are reported, not enforced: ``goals_met``); 2 bad input (no CUDA without
--smoke, wheels for another Python); 1 when a part failed; 124 when a part ran past its bound.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOALS = {"engine_vs_plain_mfu_ratio": 0.98, "mfu": 0.50, "data_wait_share": 0.01}
# seconds per part on one H200 (compile included); --smoke uses SMOKE_BOUNDS
BOUNDS = {"a": 190, "b": 110, "c": 70, "d": 90}  # 460 s: the whole run < 8 min with the install
SMOKE_BOUNDS = {"a": 300, "b": 240, "c": 240, "d": 300}  # a 2-core box under others' load


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny, on the CPU with gloo (make test)")
    p.add_argument("--wheels", help="install these packed wheels (dist/device/wheels) into a temporary folder first")
    p.add_argument("--parts", default="a,b,c,d", help="which parts, comma-separated (default a,b,c,d)")
    p.add_argument("--micro-batch", type=int, help="per forward pass (default 64; smoke 8): docs/benchmarks.md")
    p.add_argument("--global-batch", type=int, help="per optimizer step (default 128; smoke 16)")
    p.add_argument("--steps", type=int, help="timed steps after one warm-up log window (default 30; smoke 15)")
    p.add_argument("--loss-rtol", type=float, default=0.02, help="part b on a GPU: loss tolerance (default 0.02)")
    p.add_argument("--work", help="scratch folder (default: a temporary one, removed)")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # the child after the install
    p.add_argument("--installed", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------ install


def install(wheels: Path, target: Path) -> dict[str, Any]:
    """The packed wheels into ``target``: pip --no-index --no-deps --target, or unzipped when pip is absent."""
    files = sorted(wheels.glob("*.whl"))
    if not files:
        raise SystemExit(f"error: --wheels {wheels}: no .whl files (run make device-pack)")
    manifest = wheels.parent / "manifest.json"
    want = json.loads(manifest.read_text()).get("python_version") if manifest.exists() else None
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if want and want != have:
        raise SystemExit(f"error: --wheels {wheels}: packed for Python {want}, this is {have} "
                         f"(PYTHON_VERSION={have} make device-pack)")
    t0 = time.perf_counter()
    # compiled at install (pip's default): without .pyc files every Ray process of the first start (GCS, raylet's
    # agents, workers) compiles Ray's modules itself, and the raylet gives up waiting for its agent (seen here)
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet",
           "--disable-pip-version-check", "--target", str(target), *map(str, files)]
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True, timeout=60)
    has_pip = probe.returncode == 0
    if has_pip:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"error: pip install --target failed: {proc.stderr.strip()[-500:]}")
    else:
        _unzip(files, target)
        subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", str(target)], timeout=300, check=False)
    return {"wheels": len(files), "bytes": sum(f.stat().st_size for f in files), "via": "pip" if has_pip else "unzip",
            "seconds": round(time.perf_counter() - t0, 1)}


def _unzip(files: list[Path], target: Path) -> None:
    """A wheel is a zip of its install tree (``*.data/purelib|platlib`` aside); keep the executable bits."""
    import zipfile

    for f in files:
        with zipfile.ZipFile(f) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if parts[0].endswith(".data"):
                    if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                        continue
                    parts = parts[2:]
                dest = target.joinpath(*parts)
                if info.is_dir():
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(info))
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    dest.chmod(mode)


def outer(a: argparse.Namespace, argv: list[str]) -> int:
    """Install, then run the check in a child that sees the installed folder (hard-bounded as a whole)."""
    target = Path(tempfile.mkdtemp(prefix="gpu-ray-site-"))
    try:
        info = install(Path(a.wheels), target)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)])}
        bounds = SMOKE_BOUNDS if a.smoke else BOUNDS
        child = [sys.executable, str(Path(__file__).resolve()), *argv, "--inner", "--installed", json.dumps(info)]
        try:
            return subprocess.run(child, env=env, timeout=sum(bounds.values()) + 60).returncode
        except subprocess.TimeoutExpired:
            print("error: bench/gpu_ray.py ran past the sum of its part bounds", file=sys.stderr)
            return 124
    finally:
        shutil.rmtree(target, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ parts


class Check:
    """The run's state: settings, the JSON so far, and a bound per part."""

    def __init__(self, a: argparse.Namespace, work: Path):
        self.a, self.work, self.smoke = a, work, a.smoke
        self.steps = a.steps or (15 if a.smoke else 30)
        self.log_every = 5 if a.smoke else 10
        self.g = a.global_batch or (16 if a.smoke else 128)
        self.micro = a.micro_batch or (8 if a.smoke else 64)
        self.out: dict[str, Any] = {"mode": "smoke" if a.smoke else "full", "parts": {}}
        self.bounds = SMOKE_BOUNDS if a.smoke else BOUNDS
        self.json_out: Any = sys.stdout

    @property
    def max_steps(self) -> int:
        return self.log_every + self.steps  # the first log window (compile, allocator) is left out of throughput

    def base(self, name: str) -> list[str]:
        """jobs.train arguments every part starts from: configs/gpt-124m.yaml on one worker, jsonl tracking."""
        samples = int(self.max_steps * self.g / 0.99) + 8
        args = ["--config", "configs/gpt-124m.yaml", f"name={name}", "scaling.num_workers=1",
                f"scaling.use_gpu={'false' if self.smoke else 'true'}", "tracking.backend=jsonl",
                f"tracking.uri={self.work / 'tracking'}", "tracking.experiment=gpu-ray",
                f"tracking.log_every_steps={self.log_every}", f"checkpoint.storage_path={self.work / 'results'}",
                "checkpoint.every_seconds=null", f"train.global_batch_size={self.g}",
                f"train.micro_batch_size={self.micro}", f"train.max_steps={self.max_steps}", "train.warmup_steps=5",
                f"data.num_samples={samples}", "data.val_fraction=0.01", "failure.max_failures=2"]
        if self.smoke:  # bench/gpu.py --smoke's shape, so the plain loop is the same model
            args += ["model.n_layer=2", "model.n_head=2", "model.d_model=64", "model.seq_len=64",
                     "model.vocab_size=256", "train.compile=false", "perf.peak_tflops=0.5"]
        return args

    def train(self, name: str, *extra: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        """One jobs.train run in this process (its console on stderr); its summary, exit code and wall."""
        from jobs import train

        summary_path = self.work / f"{name}.json"
        saved = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        err = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(sys.stderr), _tee_stderr(err):
                code = train.main([*self.base(name), *extra, "--summary-json", str(summary_path)])
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        return {"exit_code": code, "wall_s": round(time.perf_counter() - t0, 1), "summary": summary,
                "stderr_lines": [ln for ln in err.getvalue().splitlines() if ln.strip()][-5:]}

    def losses(self, summary: dict[str, Any]) -> dict[int, float]:
        """train_loss by step from the run's jsonl metrics (the last value written for a step wins)."""
        path = self.work / "tracking" / "gpu-ray" / str(summary.get("mlflow_run_id")) / "metrics.jsonl"
        out: dict[int, float] = {}
        for line in path.read_text().splitlines() if path.exists() else []:
            row = json.loads(line)
            if row.get("key") == "train_loss":
                out[int(row["step"])] = float(row["value"])
        return out


@contextlib.contextmanager
def _tee_stderr(buf: io.StringIO):
    """Keep what is written to stderr (the one-line refusal) while still printing it."""
    real = sys.stderr

    class Tee(io.TextIOBase):
        def write(self, s: str) -> int:
            buf.write(s)
            return real.write(s)

        def flush(self) -> None:
            real.flush()

    sys.stderr = Tee()
    try:
        yield
    finally:
        sys.stderr = real


def perf(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary.get(k) for k in ("mfu", "tokens_per_second", "data_wait_share", "peak_memory_bytes",
                                        "samples_per_second", "steps", "status", "restarts", "world_sizes",
                                        "params_sha256", "time_to_first_step_s", "wall_s")}


def plain_loop(c: Check, label: str) -> dict[str, Any]:
    """bench/gpu.py's hand-written loop, same shape, batches and step counts, in its own process."""
    out = c.work / f"plain-{label}.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu.py"), "--runs", "plain", "--steps", str(c.steps),
           "--warmup", str(c.log_every), "--global-batch", str(c.g), "--micro-batch", str(c.micro), "--out", str(out)]
    cmd += ["--smoke"] if c.smoke else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=c.bounds["a"])
    if proc.returncode != 0:
        raise RuntimeError(f"bench/gpu.py plain: exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    result = json.loads(out.read_text())
    return {**result["plain"], "device": result["device"], "peak_tflops": result["peak_tflops"]}


def part_a(c: Check) -> dict[str, Any]:
    first = plain_loop(c, "1")
    engine = c.train("a-engine")
    second = plain_loop(c, "2")
    e = perf(engine["summary"])
    plain_mfu = [p["mfu"] for p in (first, second) if p.get("mfu")]
    ratio = e["mfu"] / (sum(plain_mfu) / len(plain_mfu)) if e.get("mfu") and plain_mfu else None
    c.out["a_losses"] = c.losses(engine["summary"])
    return {"plain_before": first, "engine": e, "plain_after": second, "engine_exit_code": engine["exit_code"],
            "engine_wall_s": engine["wall_s"], "engine_vs_plain_mfu_ratio": ratio,
            "ok": engine["exit_code"] == 0 and e.get("status") == "FINISHED"}


def part_b(c: Check) -> dict[str, Any]:
    every = c.log_every
    kill_at = 2 * every + every // 2  # after the checkpoint at 2 x every: resumes there, recomputes half a window
    fault = f"step={kill_at},mode=exit,marker={c.work / 'b-fault.json'}"
    run = c.train("b-fault", f"checkpoint.every_steps={every}", env={"ELASTIC_TRAIN_FAULT": fault})
    s = run["summary"]
    before, after = c.out.get("a_losses") or {}, c.losses(s)
    common = sorted(k for k in after if k in before and k > 2 * every)
    diffs = [abs(after[k] - before[k]) / max(abs(before[k]), 1e-12) for k in common]
    a_sha = ((c.out["parts"].get("a") or {}).get("engine") or {}).get("params_sha256")
    bitwise = bool(common) and all(after[k] == before[k] for k in common)
    rtol = 0.0 if c.smoke else c.a.loss_rtol  # the CPU is deterministic: the smoke run must be bitwise
    return {"fault": fault, "fault_fired": (c.work / "b-fault.json").exists(), "exit_code": run["exit_code"],
            "wall_s": run["wall_s"], **perf(s), "params_sha256": s.get("params_sha256"), "a_params_sha256": a_sha,
            "steps_compared": common, "loss_max_rel_diff": max(diffs) if diffs else None, "loss_bitwise": bitwise,
            "loss_rtol": rtol,
            "ok": run["exit_code"] == 0 and s.get("restarts") == 1 and bool(diffs) and max(diffs) <= rtol}


def part_c(c: Check) -> dict[str, Any]:
    fsdp = c.train("c-fsdp", "scaling.strategy=fsdp", f"train.max_steps={2 * c.log_every}")  # it works: no timing
    refused = c.train("c-two-on-one-gpu", "scaling.num_workers=2", "scaling.use_gpu=true",
                      "scaling.resources_per_worker={CPU: 1, GPU: 0.5}")
    lines = refused["stderr_lines"]
    one_line = len(lines) == 1 and lines[0].startswith("error: scaling.resources_per_worker=") and "NCCL" in lines[0]
    return {"fsdp": {"exit_code": fsdp["exit_code"], "wall_s": fsdp["wall_s"], **perf(fsdp["summary"])},
            "two_workers_one_gpu": {"exit_code": refused["exit_code"], "stderr": lines, "wall_s": refused["wall_s"]},
            "ok": fsdp["exit_code"] == 0 and refused["exit_code"] == 2 and one_line}


def part_d(c: Check) -> dict[str, Any]:
    shards = token_shards(c)
    tokens = c.train("d-tokens", "data.name=tokens", f"data.path={shards['path']}", "data.val_tokens=65536")
    stream_path = ray_data_parquet(c)
    stream = c.train("d-stream", "data.name=ray", f"data.path={stream_path}", "data.features=[x]",
                     "data.feature_shape=[3, 32, 32]", "data.id_column=id", "data.ray_mode=stream",
                     "model.name=cnn", "train.compile=false", "train.max_steps=null", "train.epochs=2",
                     f"train.global_batch_size={64 if c.smoke else 256}", "train.micro_batch_size=null")
    t, s = perf(tokens["summary"]), perf(stream["summary"])
    return {"shards": shards, "tokens": {"exit_code": tokens["exit_code"], "wall_s": tokens["wall_s"], **t},
            "ray_stream": {"exit_code": stream["exit_code"], "wall_s": stream["wall_s"], **s},
            "ok": tokens["exit_code"] == 0 and stream["exit_code"] == 0}


def token_shards(c: Check) -> dict[str, Any]:
    """The standard library's .py sources as a corpus (~16 MB; smoke ~0.5 MB), tokenized by jobs.prepare_tokens."""
    corpus, out = c.work / "corpus", c.work / "shards"
    corpus.mkdir(exist_ok=True)
    budget, size = (500_000 if c.smoke else 16_000_000), 0
    for i, f in enumerate(sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))):
        if size >= budget:
            break
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = f.read_text(encoding="utf-8")
            (corpus / f"{i:05d}.txt").write_text(text)
            size += len(text)
    tok = ["--tokenizer", "bytes"] if c.smoke else ["--vocab-size", "8192"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "jobs.prepare_tokens", str(corpus), "--out", str(out), *tok],
                          cwd=ROOT, capture_output=True, text=True, timeout=c.bounds["d"])
    if proc.returncode != 0:
        raise RuntimeError(f"prepare_tokens: exit {proc.returncode}: {proc.stderr.strip()[-800:]}")
    index = json.loads((out / "index.json").read_text())
    return {"path": str(out), "corpus_bytes": size, "train_tokens": index["train"]["tokens"],
            "vocab_size": index["vocab_size"], "prepare_s": round(time.perf_counter() - t0, 1)}


def ray_data_parquet(c: Check) -> Path:
    """Rows ``id, x (3x32x32 float32: the label's pattern plus noise), label`` in 8 Parquet files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    path, rows, files = c.work / "stream", (1_024 if c.smoke else 20_000), 8
    path.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    patterns = rng.standard_normal((10, 3 * 32 * 32)).astype(np.float32)
    for i in range(files):
        ids = np.arange(i * rows // files, (i + 1) * rows // files, dtype=np.int64)
        labels = ids % 10
        x = patterns[labels] + 0.1 * rng.standard_normal((len(ids), 3 * 32 * 32)).astype(np.float32)
        pq.write_table(pa.table({"id": ids, "x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 3072),
                                 "label": labels}), path / f"part-{i:03d}.parquet")
    return path


PARTS = {"a": part_a, "b": part_b, "c": part_c, "d": part_d}


# ------------------------------------------------------------------------------------------------ main


def emit(c: Check, path: str | None) -> str:
    text = json.dumps(c.out, indent=2, default=str)
    if path:
        Path(path).write_text(text + "\n")
    return text


def run_part(c: Check, name: str) -> None:
    """One part under its bound: past it, the JSON so far (this part ``timed out``) and exit 124."""
    def expire() -> None:
        c.out["parts"][name] = {"ok": False, "error": f"timed out after {c.bounds[name]} s"}
        print(emit(c, c.a.out), file=c.json_out, flush=True)
        os._exit(124)

    timer = threading.Timer(c.bounds[name], expire)
    timer.daemon = True
    timer.start()
    t0 = time.perf_counter()
    try:
        c.out["parts"][name] = PARTS[name](c)
    except Exception as e:  # a failed part is recorded; the others still run
        c.out["parts"][name] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:1500]}"}
    finally:
        timer.cancel()
    c.out["parts"][name]["part_s"] = round(time.perf_counter() - t0, 1)
    emit(c, c.a.out)  # what is done so far survives a later part's timeout


def goals(c: Check) -> dict[str, Any]:
    p = c.out["parts"]
    a, d = p.get("a") or {}, p.get("d") or {}
    checks = {
        "a_engine_vs_plain_mfu_ratio": a.get("engine_vs_plain_mfu_ratio"),
        "a_mfu": (a.get("engine") or {}).get("mfu"),
        "d_tokens_data_wait_share": (d.get("tokens") or {}).get("data_wait_share"),
        "d_stream_data_wait_share": (d.get("ray_stream") or {}).get("data_wait_share"),
    }
    met = {
        "a_engine_vs_plain_mfu_ratio":
            (checks["a_engine_vs_plain_mfu_ratio"] or 0) >= GOALS["engine_vs_plain_mfu_ratio"],
        "a_mfu": (checks["a_mfu"] or 0) >= GOALS["mfu"],
        "d_tokens_data_wait_share": checks["d_tokens_data_wait_share"] is not None
        and checks["d_tokens_data_wait_share"] <= GOALS["data_wait_share"],
        "d_stream_data_wait_share": checks["d_stream_data_wait_share"] is not None
        and checks["d_stream_data_wait_share"] <= GOALS["data_wait_share"],
        **{f"{k}_ok": bool(v.get("ok")) for k, v in p.items()},
    }
    return {"figures": checks, "goals": GOALS, "goals_met": met}


def inner(a: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    import torch

    if not a.smoke and not torch.cuda.is_available():
        print("error: no CUDA device; run with --smoke on a CPU", file=sys.stderr)
        return 2
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH", ""), str(ROOT)] if p)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    sys.path.insert(0, str(ROOT))
    import ray

    json_out = os.fdopen(os.dup(1), "w")  # stdout holds the JSON alone: everything else (Ray's worker lines) -> 2
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="gpu-ray-"))
    work.mkdir(parents=True, exist_ok=True)
    c = Check(a, work)
    c.json_out = json_out
    c.out.update({"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not a.smoke else "cpu",
                  "torch": torch.__version__, "ray": ray.__version__, "python": sys.version.split()[0],
                  "ray_from": str(Path(ray.__file__).parent), "installed": json.loads(a.installed or "null"),
                  "global_batch": c.g, "micro_batch": c.micro, "timed_steps": c.steps})
    ray.init(address="local", num_cpus=4 if a.smoke else os.cpu_count(), include_dashboard=False,
             logging_level="ERROR")
    try:
        for name in a.parts.split(","):
            run_part(c, name.strip())
    finally:
        ray.shutdown()
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    c.out.pop("a_losses", None)
    c.out.update(goals(c))
    c.out["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(emit(c, a.out), file=json_out, flush=True)
    return 0 if all(v.get("ok") for v in c.out["parts"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if unknown := [p for p in a.parts.split(",") if p.strip() not in PARTS]:
        print(f"error: --parts: unknown part(s) {','.join(unknown)}; known: {','.join(PARTS)}", file=sys.stderr)
        return 2
    if a.wheels and not a.inner:
        try:
            return outer(a, argv)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
    return inner(a)


if __name__ == "__main__":
    sys.exit(main())
