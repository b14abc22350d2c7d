"""The sweep's console while it runs: one line per trial as it ends, ranked by the same rule as the final table.

Tune's own progress table is off (``verbose=0``): it shows each trial's *last* reported metric, which is not the
sweep's rule (a trial's best checkpoint, :mod:`elastic_train.sweep.results`).
"""

from __future__ import annotations

from ray.tune import Callback

from elastic_train.sweep.results import TrialLines


class TrialProgress(TrialLines, Callback):
    """:class:`~elastic_train.sweep.results.TrialLines` as a Tune callback."""
