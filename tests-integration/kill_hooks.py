"""A callback the integration tests name in a YAML (`type: kill_hooks:KillAtStep`): it SIGKILLs
its own training process at the end of a step, a crash with no cleanup at a known point. With
`once`, a file that it creates first: a rerun of the same YAML (the file there) is not killed."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from mf_trainer import Callback


class KillAtStep(Callback):
    def __init__(self, step: int, once: str | None = None):
        self.step = step
        self.once = Path(once) if once else None

    def on_step_end(self, trainer, metrics):
        if metrics["step"] != self.step:
            return
        if self.once is not None:
            if self.once.exists():
                return
            self.once.touch()
        os.kill(os.getpid(), signal.SIGKILL)
