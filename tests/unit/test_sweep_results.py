"""Best means one thing: a trial's best is its best retained checkpoint by sweep.metric, and the sweep's best is
the trial whose best is best -- the same trial, value, epoch and checkpoint in every output."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from elastic_train import config as config_mod
from elastic_train.launch.storage import RunStorage
from elastic_train.sweep.results import (
    CheckpointScore,
    TrialLines,
    TrialRow,
    best_checkpoint,
    best_row,
    is_better,
    pick_best,
    rank_rows,
    read_trial,
    render_table,
    score_of,
    trial_line,
    write_results_csv,
)
from tests.conftest import ROOT


def write_checkpoint(root: Path, run: str, step: int, epoch: float, val_loss: float | None, *,
                     world_sizes: list[int], restarts: int = 0) -> str:
    """A trial's checkpoint folder as a worker leaves it: only meta.json matters here."""
    d = root / run / f"checkpoint_{step:09d}"
    d.mkdir(parents=True)
    metrics = {"epoch": epoch, "global_step": step, "restarts": restarts}
    if val_loss is not None:
        metrics["val_loss"] = val_loss
    (d / "meta.json").write_text(json.dumps({"progress": {"epoch": int(epoch), "global_step": step},
                                             "world_sizes": world_sizes, "metrics": metrics}))
    return str(d)


def test_is_better_follows_the_mode_and_ties_do_not_win():
    assert is_better(0.1, None, "min") and is_better(0.1, 0.2, "min") and not is_better(0.2, 0.1, "min")
    assert is_better(0.9, 0.8, "max") and not is_better(0.8, 0.9, "max")
    assert not is_better(0.5, 0.5, "min") and not is_better(0.5, 0.5, "max")


def test_pick_best_skips_unscored_and_keeps_the_earlier_of_a_tie():
    scores = [CheckpointScore("a", 0.5, 1, 10), CheckpointScore("b", None, 2, 20), CheckpointScore("c", 0.3, 3, 30),
              CheckpointScore("d", 0.3, 4, 40), CheckpointScore("e", 0.4, 5, 50)]
    assert pick_best(scores, "min").uri == "c"
    assert pick_best(scores, "max").uri == "a"
    assert pick_best([CheckpointScore("x", None)], "min") is None and pick_best([], "max") is None


def row(tid: str, best: float | None, status: str = "FINISHED", last: float | None = None) -> TrialRow:
    """A row whose best checkpoint scored ``best`` and whose last report was ``last``."""
    history = [(1.0, best), (2.0, last if last is not None else best)] if best is not None else []
    return TrialRow(tid, f"trial-{tid}", {"train.lr": 0.01}, status, best, 2, history, checkpoint=f"/c/{tid}",
                    best_epoch=1.0 if best is not None else None, best_step=7 if best is not None else None)


def test_ranking_is_by_the_best_checkpoint_not_the_last_report():
    # b's last report (0.9) is worse than a's (0.4), but b's best checkpoint (0.2) beats a's (0.3).
    rows = [row("a", 0.3, last=0.4), row("f", None, "FAILED"), row("b", 0.2, last=0.9)]
    assert [r.trial_id for r in rank_rows(rows, "min")] == ["b", "a", "f"]
    assert best_row(rows, "min").trial_id == "b"
    assert [r.trial_id for r in rank_rows(rows, "max")] == ["a", "b", "f"]
    assert best_row([row("f", None, "FAILED")], "min") is None


def test_read_trial_reads_the_best_checkpoint_world_sizes_and_restarts(tmp_path):
    write_checkpoint(tmp_path, "trial-t", 8, 1, 0.50, world_sizes=[2])
    best = write_checkpoint(tmp_path, "trial-t", 16, 2, 0.25, world_sizes=[2, 1], restarts=1)
    write_checkpoint(tmp_path, "trial-t", 24, 3, 0.30, world_sizes=[2, 1, 2], restarts=2)
    storage = RunStorage(str(tmp_path), "trial-t")
    seen = read_trial(storage, "val_loss", "min")
    assert (seen.best.uri, seen.best.value, seen.best.epoch, seen.best.step) == (best, 0.25, 2, 16)
    assert seen.world_sizes == [2, 1, 2] and seen.restarts == 2 and seen.epochs == 3
    assert seen.latest.endswith("checkpoint_000000024")
    assert best_checkpoint(storage, "val_loss", "min") == best
    # A metric no checkpoint carries: no best, and best_checkpoint falls back to the latest.
    assert read_trial(storage, "val_accuracy", "max").best is None
    assert best_checkpoint(storage, "val_accuracy", "max") == seen.latest
    empty = read_trial(RunStorage(str(tmp_path), "trial-none"), "val_loss", "min")
    assert (empty.best, empty.latest, empty.world_sizes, empty.restarts) == (None, None, [], 0)


def test_score_of_reads_a_meta_without_the_metric():
    assert score_of("u", {"metrics": {"epoch": 1, "global_step": 3}}, "val_loss") == CheckpointScore("u", None, 1, 3)
    assert score_of("u", {"metrics": {"val_loss": 1}, "progress": {"global_step": 5}}, "val_loss").step == 5


def test_the_console_line_table_and_csv_name_the_same_best(tmp_path):
    """The per-trial line (TrialLines, as Tune calls it), the final table and results.csv agree on the best."""
    cfg = config_mod.load(ROOT / "configs/sweep-digits.yaml", ["train.epochs=3"])
    sweep_dir = tmp_path / "s"
    for tid, losses in {"a": [0.6, 0.2, 0.9], "b": [0.5, 0.4, 0.3]}.items():
        for i, loss in enumerate(losses):
            write_checkpoint(sweep_dir, f"trial-{tid}", 10 * (i + 1), i + 1, loss, world_sizes=[2],
                             restarts=int(tid == "b"))
    lines = TrialLines(str(sweep_dir), cfg)
    rows = [lines.row(SimpleNamespace(trial_id=t, config={"train.lr": lr}), failed=False)
            for t, lr in (("a", 0.01), ("b", 0.001))]
    assert [(r.status, r.best_metric, r.best_epoch, r.best_step, r.restarts) for r in rows] == [
        ("FINISHED", 0.2, 2, 20, 0), ("FINISHED", 0.3, 3, 30, 1)]
    assert trial_line(rows[0], "val_loss") == (
        "trial a FINISHED: 3 epochs, best val_loss 0.2 (epoch 2, step 20); world sizes 2, restarts 0; train.lr=0.01")
    ranked = rank_rows(rows, "min")
    top = best_row(rows, "min")
    summary = {"trials": [r.to_dict() for r in ranked], "metric": "val_loss", "sweep": "s", "total_epochs": 6,
               "wall_s": 1.0, "mlflow_parent_run_id": None,
               "best": {"trial_id": top.trial_id, "metric": top.best_metric, "epoch": top.best_epoch,
                        "config": top.config, "checkpoint": top.checkpoint, "mlflow_run_id": None}}
    table = render_table(summary).splitlines()
    assert table[2].split()[:8] == ["1", "a", "FINISHED", "3", "0.2", "2", "2", "0"]
    assert "best: a val_loss=0.2 at epoch 2 (its best checkpoint)" in "\n".join(table)
    write_results_csv(ranked, cfg, tmp_path / "r.csv")
    first = next(csv.DictReader((tmp_path / "r.csv").open()))
    assert (first["trial_id"], float(first["best_val_loss"]), first["best_epoch"], first["world_sizes"],
            first["checkpoint"]) == ("a", 0.2, "2", "2", top.checkpoint)
    assert top.checkpoint.endswith("trial-a/checkpoint_000000020")


def test_a_stopped_trial_reads_as_stopped(tmp_path):
    cfg = config_mod.load(ROOT / "configs/sweep-digits.yaml", ["train.epochs=3"])
    write_checkpoint(tmp_path, "trial-s", 5, 1, 0.7, world_sizes=[1, 2], restarts=1)
    r = TrialLines(str(tmp_path), cfg).row(SimpleNamespace(trial_id="s", config={}), failed=False)
    assert (r.status, r.epochs, r.world_sizes) == ("STOPPED", 1, [1, 2])
    failed = TrialLines(str(tmp_path), cfg).row(SimpleNamespace(trial_id="none", config={}), failed=True)
    assert failed.status == "FAILED" and failed.best_metric is None
    assert "no val_loss checkpoint" in trial_line(failed, "val_loss")


@pytest.mark.parametrize("metric,mode", [("val_loss", "min"), ("val_accuracy", "max")])
def test_a_sweep_scores_checkpoints_by_its_own_metric(metric, mode):
    """The trials keep the checkpoint the sweep calls best: checkpoint.score follows sweep.metric."""
    from elastic_train.launch.context import RunContext  # noqa: F401 - the plan needs the launch layer
    from elastic_train.sweep.plan import SweepPlan
    from elastic_train.sweep.tuner import resolved_base

    cfg = config_mod.load(ROOT / "configs/sweep-digits.yaml",
                          [f"sweep.metric={metric}", f"sweep.mode={mode}", "tracking.enabled=false"])
    ctx = SimpleNamespace(cfg=cfg, storage_path="/tmp/sweeps", run_name="s")
    base = resolved_base(SweepPlan(ctx, restoring=False))
    assert (base.checkpoint.score, base.checkpoint.score_mode) == (metric, mode)
