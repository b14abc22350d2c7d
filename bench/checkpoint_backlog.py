"""Checkpoint uploads on a link slower than the checkpoint interval: how far behind durable storage a run falls,
what a failure costs, and how long the end of the run waits (issue 51 item 11). JSON.

    .venv/bin/python bench/checkpoint_backlog.py --smoke      # one cadence, ~1 minute on 2 loaded cores
    .venv/bin/python bench/checkpoint_backlog.py              # checkpoints every 2 and every 11 steps, a kill

``jobs.train`` on the digits preset (2 workers, tracking off, ``--epochs``) with ``checkpoint.storage_path`` on a
real S3 API (``moto_server``) reached through a link that carries ``--link-mb-s`` MB/s upstream
(tests/helpers/s3.py ``SlowLink``): rank 0's checkpoint is ~1 MB, so an upload takes about a second at 1 MB/s
while a step takes milliseconds. For each cadence (``--every``, a comma list; epoch ends are checkpoints too) one
run, optionally with rank 1 killed at ``--kill-at``; ``auto`` is ``checkpoint.every_steps=auto`` with a prior
MTBF of ``--mtbf-s`` per worker (its last choice is reported: the interval, its cost until durable, the upload).

Per run: checkpoints taken and uploads measured (their mean time from hand-off to durable), at worst how many
steps and seconds training ran ahead of its newest durable checkpoint (the summary's ``behind_storage``), the
blocking checkpoint time (the waits for the previous upload included), the teardown's ``workers stop`` (the end of
the run waiting for uploads), the wall, and after a kill the steps recomputed (the step killed at minus the step
resumed from). A summary without ``behind_storage`` (an engine before this bound) reports those as null.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(home: Path, storage: str, every: str, args: argparse.Namespace) -> dict[str, Any]:
    from jobs import train

    name = f"backlog-{every}-{uuid.uuid4().hex[:6]}"
    summary_path, markers = home / f"{name}.json", home / f"{name}-markers"
    os.environ.pop("ELASTIC_TRAIN_FAULT", None)
    if args.kill_at:
        os.environ["ELASTIC_TRAIN_FAULT"] = f"step={args.kill_at},rank=1; markers={markers}"
    argv = ["--config", str(ROOT / "configs/digits.yaml"), f"name={name}", f"checkpoint.storage_path={storage}",
            f"checkpoint.every_steps={every}", "checkpoint.every_seconds=null", f"train.epochs={args.epochs}",
            "tracking.enabled=false", "scaling.num_workers=2", "failure.spare_workers=0",
            *([f"failure.mtbf_s={args.mtbf_s}"] if every == "auto" else []), "--summary-json", str(summary_path)]
    with contextlib.redirect_stdout(sys.stderr):  # the job's console: stdout is this benchmark's JSON
        rc = train.main(argv)
    os.environ.pop("ELASTIC_TRAIN_FAULT", None)
    if rc != 0:
        raise SystemExit(f"the run with a checkpoint every {every} steps failed with exit code {rc}")
    s = json.loads(summary_path.read_text())
    behind, g, run_book = s.get("behind_storage") or {}, s["goodput"], s.get("goodput_run") or {}
    return {"every_steps": every, "steps": s["steps"], "checkpoints": run_book.get("checkpoints"),
            "uploads": behind.get("uploads"), "upload_s_mean": _round(behind.get("upload_s_mean")),
            "behind_worst_steps": behind.get("worst_steps"), "behind_worst_s": _round(behind.get("worst_s")),
            "checkpoint_s": _round(g["checkpoint_s"]), "productive_s": _round(g["productive_s"]),
            "workers_stop_s": _round(s["teardown"].get("workers stop")), "teardown_s": _round(g["teardown_s"]),
            "wall_s": _round(s["wall_s"]), "restarts": s["restarts"], "recomputed_steps": _recomputed(markers),
            **({"auto": _auto(s.get("checkpoint_interval"))} if every == "auto" else {})}


def _auto(choice: dict[str, Any] | None) -> dict[str, Any] | None:
    """checkpoint.every_steps=auto: the last choice, in the terms it was made (train/interval.py)."""
    if not choice:
        return None
    keys = ("every_steps", "interval_s", "checkpoint_cost_s", "blocking_s", "upload_s", "mtbf_s", "step_s")
    return {k: _round(choice.get(k)) if k != "every_steps" else choice.get(k) for k in keys}


def _recomputed(markers: Path) -> int | None:
    """The step rank 1 was killed at minus the step the restart resumed from (None: no kill)."""
    fault = markers / "fault-0.json"
    if not fault.exists():
        return None
    killed = json.loads(fault.read_text())
    phases = [json.loads(line) for line in (markers / "phases.rank0.jsonl").read_text().splitlines()]
    resumed = [r["step"] for r in phases if r["event"] == "restored" and r["unix"] > killed["unix"]]
    return killed["step"] - resumed[0] if resumed else killed["step"]  # no checkpoint: from the start


def _round(v: float | None) -> float | None:
    return round(v, 3) if isinstance(v, int | float) else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="one cadence (every 2 steps), 2 epochs, a kill at 15")
    p.add_argument("--every", default="2,11", help="checkpoint cadences to run: steps or auto (comma list)")
    p.add_argument("--mtbf-s", type=float, default=60.0, help="with auto: the prior MTBF per worker, seconds")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--link-mb-s", type=float, default=1.0, help="the link's upstream, MB/s")
    p.add_argument("--kill-at", type=int, default=30, help="kill rank 1 at this step (0: no kill)")
    args = p.parse_args()
    if args.smoke:
        args.every, args.epochs, args.kill_at = "2", 2, 15
    import ray

    from tests.helpers.s3 import SlowLink, start_s3_server

    server = start_s3_server()
    link = SlowLink(server.endpoint, args.link_mb_s * 1e6)
    try:
        os.environ.update(server.env())
        os.environ["AWS_ENDPOINT_URL"] = link.endpoint
        bucket = f"backlog-{uuid.uuid4().hex[:8]}"
        server.client().create_bucket(Bucket=bucket)
        with tempfile.TemporaryDirectory(prefix="et-bench-") as tmp:
            home = Path(tmp)
            os.environ["ELASTIC_TRAIN_HOME"] = str(home)
            ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
            runs = [run(home, f"s3://{bucket}/runs", e.strip(), args) for e in args.every.split(",")]
            ray.shutdown()
    finally:
        link.close()
        server.stop()
    print(json.dumps({
        "benchmark": "checkpoint_backlog",
        "task": f"digits, MLP 64-256-256-10, 2 workers, {args.epochs} epoch(s), tracking off, checkpoints on S3 "
                f"(moto) through a {args.link_mb_s:g} MB/s upstream link"
                + (f", rank 1 killed at step {args.kill_at}" if args.kill_at else ""),
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        "link_uploaded_mb": round(link.uploaded / 1e6, 2),
        "runs": runs,
    }, indent=2))


if __name__ == "__main__":
    main()
