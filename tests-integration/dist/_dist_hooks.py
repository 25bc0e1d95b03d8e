"""A callback the dist tests name in a YAML (`type: _dist_hooks:KillRankAtStep`): one rank of a
parallel run SIGKILLs itself at the end of a step, a crash without any cleanup or error report."""

from __future__ import annotations

import os
import signal

from mf_trainer import Callback


class KillRankAtStep(Callback):
    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step

    def on_step_end(self, trainer, metrics):
        if trainer.parallel.rank == self.rank and metrics["step"] == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
