"""The `profiler` section as a callback: mindspore.Profiler over steps [start_step, end_step].

The profile is written under `profiler.output_path` (default `<output_dir>/profile`) and analysed
when the window closes. `profiler_rank` lists the ranks that profile (this single-process run is
rank 0). On CPU only CPU activity exists; the Ascend-only options are refused by `support`, and
`with_stack` (default true) is passed through where the device has it.
"""

from __future__ import annotations

import logging
import os

from mf_trainer.callbacks import Callback

log = logging.getLogger("mf_trainer")


class ProfilerCallback(Callback):
    def __init__(self, prof_cfg, output_dir: str, device: str, rank: int = 0):
        self.cfg = prof_cfg
        self.device = device
        self.enabled = prof_cfg.enable_profiling and (prof_cfg.profiler_rank is None or rank in prof_cfg.profiler_rank)
        self.output_path = prof_cfg.output_path or os.path.join(output_dir, "profile")
        self.profiler = None

    def _make(self):
        import mindspore as ms
        from mindspore.profiler import ProfilerActivity, ProfilerLevel

        kwargs = {"start_profile": False, "output_path": self.output_path}
        if self.device == "CPU":
            kwargs["activities"] = [ProfilerActivity.CPU]
            if self.cfg.with_stack:
                log.info("profiler.with_stack: call stacks are collected on Ascend only; not on CPU")
        else:
            activities = [ProfilerActivity.NPU] + ([ProfilerActivity.CPU] if self.cfg.profile_cpu else [])
            level = {0: ProfilerLevel.Level0, 1: ProfilerLevel.Level1, 2: ProfilerLevel.Level2}[self.cfg.profiler_level]
            kwargs.update(activities=activities, profiler_level=level, with_stack=self.cfg.with_stack,
                          profile_memory=self.cfg.profile_memory, mstx=self.cfg.mstx)
        return ms.Profiler(**kwargs)

    def on_step_begin(self, trainer, step):
        if self.enabled and step == self.cfg.start_step and self.profiler is None:
            self.profiler = self._make()
            self.profiler.start()
            log.info("profiler: recording steps %d-%d into %s", self.cfg.start_step, self.cfg.end_step, self.output_path)

    def on_step_end(self, trainer, metrics):
        if self.profiler is not None and metrics["step"] >= self.cfg.end_step:
            self._finish()

    def on_train_end(self, trainer):
        if self.profiler is not None:
            self._finish()

    def _finish(self):
        profiler, self.profiler = self.profiler, None
        profiler.stop()
        profiler.analyse()
        self.enabled = False
        log.info("profiler: results in %s", self.output_path)
