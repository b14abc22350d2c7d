"""What runs inside Ray Train's controller actor for every run (a Ray Train callback of the internal kinds).

**The controller at niceness 0.** Ray starts the controller, like every worker, at niceness 15. Since the
training workers put themselves at 0 (train/priority.py), a controller left at 15 gets a sliver of CPU while
they fill the cores, and every ``ray.train.report`` waits for it: the report barrier (the controller's poll,
collecting every rank's report, registering the checkpoint) measured 0.63 s per checkpoint on 2 cores against
~50 ms when everything ran at 15 (bench/recovery.py ``checkpoint_share``). The controller mostly sleeps between
polls; at 0 it answers when polled. Kept light: the controller imports this module to unpickle the callback.
"""

from __future__ import annotations

from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback

from elastic_train.train.priority import normal_priority


class ControllerPriority(ControllerCallback):
    def after_controller_start(self, train_run_context: Any) -> None:
        normal_priority()
