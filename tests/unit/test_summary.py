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
