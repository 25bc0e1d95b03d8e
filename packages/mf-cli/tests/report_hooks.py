"""A callback the `mf report` tests name in a YAML (`type: report_hooks:PauseAtStep`, with this
directory on PYTHONPATH): it holds a real training run still at the end of a step, so a test can
report on a run that is still going, at a known point."""

from __future__ import annotations

import time
from pathlib import Path

from mf_trainer import Callback


class PauseAtStep(Callback):
    """After step `step` (its metrics line written), create `paused`, then wait for `release` to
    exist; `timeout` seconds at most, so a failed test never leaves a run hanging."""

    def __init__(self, step: int, paused: str, release: str, timeout: float = 300.0):
        self.step, self.paused, self.release, self.timeout = step, Path(paused), Path(release), timeout

    def on_step_end(self, trainer, metrics):
        if metrics["step"] != self.step:
            return
        self.paused.touch()
        deadline = time.monotonic() + self.timeout
        while not self.release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
