"""Callbacks the dist tests name in a YAML (`type: _dist_hooks:KillRankAtStep`): one rank of a
parallel run SIGKILLs itself at the end of a step, a crash without any cleanup or error report;
or SIGSTOPs itself (`StopRankAtStep`), a hang: alive, silent, its peers waiting in the next
collective."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from mf_trainer import Callback


class KillRankAtStep(Callback):
    def __init__(self, rank: int, step: int):
        self.rank, self.step = rank, step

    def on_step_end(self, trainer, metrics):
        if trainer.parallel.rank == self.rank and metrics["step"] == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class StopRankAtStep(Callback):
    """`mark`: a file that receives the wall time of the stop (the test times the watchdog from it)."""

    def __init__(self, rank: int, step: int, mark: str = ""):
        self.rank, self.step, self.mark = rank, step, mark

    def on_step_end(self, trainer, metrics):
        if trainer.parallel.rank == self.rank and metrics["step"] == self.step:
            if self.mark:
                Path(self.mark).write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)
