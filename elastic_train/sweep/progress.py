"""The sweep's console while it runs: one line per trial as it ends, ranked by the same rule as the final table.

Tune's own progress table is off (``verbose=0``): it shows each trial's *last* reported metric, which is not the
sweep's rule (a trial's best checkpoint, :mod:`elastic_train.sweep.results`).
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

from elastic_train.sweep.results import TrialLines


class TrialProgress(TrialLines, Callback):
    """:class:`~elastic_train.sweep.results.TrialLines` as a Tune callback."""


class TrialStatuses(Callback):
    """Tune callback: each trial's status into :data:`~elastic_train.sweep.results.TRIAL_STATUSES` as trials end
    and when the experiment ends (Tune's public callback API; the ResultGrid's trials are private)."""

    def _note(self, trials: list[Any]) -> None:
        from elastic_train.sweep.results import TRIAL_STATUSES

        for trial in trials:
            TRIAL_STATUSES[trial.trial_id] = trial.status

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._note(trials)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._note(trials)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        self._note(trials)
