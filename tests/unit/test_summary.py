"""The console's run summary: epochs as run, not the completed-epoch counter (issue 34 item 8)."""

from __future__ import annotations

from elastic_train.launch.summary import epochs_run, render_summary


def _summary(**over):
    base = {"run_name": "r", "status": "FINISHED", "final_metrics": {"val_loss": 0.1}, "steps": 400, "epochs": 1,
            "world_sizes": [2], "restarts": 0, "samples_per_second": None, "time_to_first_step_s": None,
            "wall_s": 1.0, "checkpoint": None, "mlflow_run_id": None, "tracking_uri": None, "params_sha256": None}
    return {**base, **over}


def test_max_steps_in_the_second_epoch_prints_the_epochs_as_run():
    assert epochs_run(400, 292, 1) == 1.37
    assert epochs_run(24, 12, 2) == 2.0
    assert epochs_run(None, 292, 1) == 1 and epochs_run(400, None, 1) == 1
    line = next(x for x in render_summary(_summary(epochs_run=1.37)).splitlines() if "steps / epochs" in x)
    assert line.rstrip().endswith("400 / 1.37"), line
    line = next(x for x in render_summary(_summary(steps=24, epochs=2, epochs_run=2.0)).splitlines()
                if "steps / epochs" in x)
    assert line.rstrip().endswith("24 / 2"), line


def test_a_goodput_book_that_cannot_be_read_is_unknown_in_the_summary_and_said_in_the_run_log(tmp_path):
    """The driver reads the goodput book from the GCS after training; a read that failed was swallowed, and the
    summary then split the wall as if nothing had trained (all of it "startup"). Here the GCS is really not there
    (no Ray in this process): the summary says "unknown" and why, the run's log says what was lost (issue 51
    item 3)."""
    import time

    from elastic_train import runlog
    from elastic_train.config import load
    from elastic_train.launch.context import RunContext
    from elastic_train.launch.fit import Outcome, read_ledger
    from elastic_train.launch.summary import summarize
    from elastic_train.train.ledger import RunLedger
    from tests.conftest import ROOT

    log = runlog.attach(tmp_path / "run")
    book, book_error = read_ledger(RunLedger("no-gcs-here"))
    assert book is None and "goodput book could not be read" in book_error
    cfg = load(str(ROOT / "configs" / "digits.yaml"), [])
    ctx = RunContext(cfg, "r", tmp_path, str(tmp_path / "storage"), False, None, time.time() - 5.0)
    summary = summarize(ctx, Outcome(None, None, book, "FINISHED", ended=time.time(), book_error=book_error,
                                     tracking_copies={"sent": 3, "unsent": 1}))
    assert summary["goodput"]["unknown"] == book_error and summary["startup"] == {}, summary["goodput"]
    assert summary["checkpoint_copies_unsent"] == 1
    table = render_summary(summary)
    assert "unknown (the goodput book could not be read" in table and "unsent checkpoint copies  1" in table, table
    assert "dropped: the goodput book" in log.read_text()
