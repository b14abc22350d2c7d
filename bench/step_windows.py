"""The small GPT's step: the engine against the minimal loop, taking turns in windows of one session. Prints JSON.

    .venv/bin/python bench/step_windows.py                 # ~8 minutes on 2 cores
    .venv/bin/python bench/step_windows.py --rounds 2      # smoke, ~4 minutes

Separate runs of either side move 10-25 % on a shared 2-core machine (docs/benchmarks.md, *Per-step overhead
on a small GPT*): more than the few per cent issue 33 (item 3) asks to resolve. Here both sides are alive at
once and take turns: bench/overhead.py's minimal loop (nanoGPT's way of stepping the small GPT) in a process of
its own, and the engine as a user runs it (``python -m jobs.train``, its embedded Ray). Every process of the
side that waits is stopped (SIGSTOP), so each window has the machine to itself, and a drift of the machine hits
both sides of a round alike. Windows, in turn, each round:

    engine    the engine with all of its Ray running (after one window left out: on a resume Ray's processes
              catch up on what their timers missed)
    worker    the engine's training worker alone, every other process of its Ray stopped: the engine's own step
              without Ray's daemons, controller and helper actors beside it
    minimal   the minimal loop alone

Rates come from each side's own clock: the engine's metric timestamps (tracking.backend=jsonl, every 10 steps),
the minimal loop's lines (every 10 steps); the first second of a window is left out. ``engine_vs_minimal`` and
``worker_vs_minimal`` are medians over rounds of the per-round ratio. A diagnostic: a user's run never stops its
Ray, and bench/overhead.py --case gpt stays the measure of record.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SKIP_S = 1.0  # the first second of a window: a resumed process's caches are cold
LINE_EVERY = 10  # steps between the minimal loop's lines (its loss is read back there, as nanoGPT's loop does)


def _minimal_child(out: str, samples: int) -> None:
    """The minimal loop (bench/overhead.py's), endless, writing ``<unix time> <step>`` every 10 steps."""
    import overhead
    import torch

    bundle, model, opt = overhead._gpt(1, samples, fused=True)
    x_all, y_all = bundle.train.x, bundle.train.y
    with open(out, "w", buffering=1) as f:
        it = 0
        while True:
            ix = torch.randint(len(x_all), (12,))
            loss = overhead._gpt_loss(model, x_all[ix], y_all[ix])
            opt.step()
            opt.zero_grad(set_to_none=True)
            if it % LINE_EVERY == 0:
                loss.item()
                f.write(f"{time.time()} {it}\n")
            it += 1


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (Ray's daemons and workers are the driver's descendants on an embedded Ray)."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat[stat.rindex(")") + 2:].split()[1]), []).append(int(p))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


def _wait_for(ready, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            sys.exit(f"step_windows: the {what} side ended (rc {proc.returncode}) before it was ready")
        if time.monotonic() > deadline:
            sys.exit(f"step_windows: no {what} after {timeout_s:g} s")
        time.sleep(0.5)


def _engine_points(tracking: Path) -> list[tuple[int, float]]:
    """(step, unix time) of every train_loss the engine logged (its worker's clock at the step)."""
    points = []
    for f in tracking.rglob("metrics.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["key"] == "train_loss":
                points.append((rec["step"], rec["timestamp"] / 1000))
    return sorted(points, key=lambda p: p[1])


def _minimal_points(path: Path) -> list[tuple[int, float]]:
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(s), float(t)) for t, s in rows]


def _rate(points: list[tuple[int, float]], t0: float, t1: float) -> float | None:
    """Samples/s (batch 12) between the first and last point inside [t0 + SKIP_S, t1]; None with fewer than 2
    (a window spent validating or checkpointing)."""
    inside = [p for p in points if t0 + SKIP_S <= p[1] <= t1]
    if len(inside) < 2 or inside[-1][1] <= inside[0][1]:
        return None
    return 12 * (inside[-1][0] - inside[0][0]) / (inside[-1][1] - inside[0][1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--_minimal", dest="minimal", help=argparse.SUPPRESS)
    args = p.parse_args()
    samples = 120_000  # enough steps that the engine outlasts every round; it is stopped at the end
    if args.minimal:
        return _minimal_child(args.minimal, samples)
    from overhead import gpt_overrides

    with tempfile.TemporaryDirectory(prefix="et-windows-") as tmp:
        home = Path(tmp)
        mini_out = home / "minimal.txt"
        mini = subprocess.Popen([sys.executable, __file__, "--_minimal", str(mini_out)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=open(home / "minimal.log", "wb"))
        engine = None
        try:
            _wait_for(lambda: mini_out.exists() and mini_out.stat().st_size > 0, 300, "minimal loop", mini)
            mini.send_signal(signal.SIGSTOP)  # the engine starts alone
            overrides = gpt_overrides(1, samples) + [
                "tracking.backend=jsonl", f"tracking.uri={home / 'tracking'}", "tracking.log_every_steps=10",
                f"checkpoint.storage_path={home / 'results'}", "checkpoint.every_seconds=null"]  # no validation
            engine = subprocess.Popen([sys.executable, "-m", "jobs.train", "--config", "configs/digits.yaml",
                                       *overrides], cwd=ROOT, env=dict(os.environ, ELASTIC_TRAIN_HOME=str(home)),
                                      stdout=open(home / "engine.log", "wb"), stderr=subprocess.STDOUT)
            _wait_for(lambda: len(_engine_points(home / "tracking")) >= 3, 600, "engine step", engine)
            ray = _descendants(engine.pid)
            workers = [q for q in ray if _comm(q).startswith("ray::RayTrainWo")]
            if len(workers) != 1:
                sys.exit(f"step_windows: expected one training worker, found {workers}")
            windows = []
            for _ in range(args.rounds):
                for kind in ("settle", "engine", "worker", "minimal"):
                    rest = [engine.pid] + [q for q in _descendants(engine.pid) if q != workers[0]]  # spares come
                    if kind in ("settle", "engine"):
                        _signal([mini.pid], signal.SIGSTOP)
                        _signal(rest + workers, signal.SIGCONT)
                    elif kind == "worker":
                        _signal(rest + [mini.pid], signal.SIGSTOP)
                        _signal(workers, signal.SIGCONT)
                    else:
                        _signal(rest + workers, signal.SIGSTOP)
                        _signal([mini.pid], signal.SIGCONT)
                    t0 = time.time()
                    time.sleep(args.window_s)
                    windows.append((kind, t0, time.time()))
        finally:
            _signal([mini.pid], signal.SIGKILL)
            _signal([mini.pid], signal.SIGCONT)
            if engine is not None:
                _signal([engine.pid, *_descendants(engine.pid)], signal.SIGCONT)
                engine.send_signal(signal.SIGTERM)  # the run ends KILLED; its Ray goes with it
                try:
                    engine.wait(120)
                except subprocess.TimeoutExpired:
                    engine.kill()
        points = {"engine": _engine_points(home / "tracking"), "minimal": _minimal_points(mini_out)}
    points["worker"] = points["engine"]
    rounds = []
    for i in range(0, len(windows), 4):
        rates = {kind: _rate(points[kind], t0, t1) for kind, t0, t1 in windows[i:i + 4] if kind != "settle"}
        rounds.append({k: (round(v, 1) if v else None) for k, v in rates.items()})

    def ratio(side: str) -> float | None:
        rs = [r[side] / r["minimal"] for r in rounds if r.get(side) and r.get("minimal")]
        return round(statistics.median(rs), 3) if rs else None

    def median(side: str) -> float | None:
        vs = [r[side] for r in rounds if r.get(side)]
        return round(statistics.median(vs), 1) if vs else None

    print(json.dumps({
        "benchmark": "step_windows",
        "task": "gpt 4 layers x 128, vocab 256, batch 12 x 64 tokens, fp32, AdamW, clip 1.0, 1 worker of 2 CPUs",
        "cpus": os.cpu_count(),
        "window_s": args.window_s,
        "statistic": "per round: samples/s of each window, its first second left out; medians over rounds",
        "rounds_samples_per_second": rounds,
        "engine_samples_per_second": median("engine"),
        "worker_alone_samples_per_second": median("worker"),
        "minimal_samples_per_second": median("minimal"),
        "engine_vs_minimal": ratio("engine"),
        "worker_vs_minimal": ratio("worker"),
        "goal_engine_vs_minimal": 0.97,
    }, indent=2))


if __name__ == "__main__":
    main()
