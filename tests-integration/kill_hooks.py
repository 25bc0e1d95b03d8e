"""A callback the integration tests name in a YAML (`type: kill_hooks:KillAtStep`): it SIGKILLs
its own training process at the end of a step, a crash with no cleanup at a known point."""

from __future__ import annotations

import os
import signal

from mf_trainer import Callback


class KillAtStep(Callback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer, metrics):
        if metrics["step"] == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
