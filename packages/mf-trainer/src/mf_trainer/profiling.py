"""The `profiler` section as a callback: mindspore.Profiler over steps [start_step, end_step].

Every rank `profiler_rank` lists profiles (null: every rank), each into its own directory when
there are several ranks (`<output_path>/rank_<r>`; default output_path `<output_dir>/profile`),
analysed when the window closes or the run ends (a window past the last step ends there). On
device_target CPU only CPU activity exists: `profile_memory` is recorded (the allocator's record),
while the detail level, the mstx markers and Python call stacks have nothing to record there (the
preflight's notices say so once); `profile_cpu: false` leaves nothing to profile on CPU, so the
profiler is not started. On Ascend every option is passed through.
"""

from __future__ import annotations

import logging
import os

from mf_trainer.callbacks import Callback

log = logging.getLogger("mf_trainer")


class ProfilerCallback(Callback):
    def __init__(self, prof_cfg, output_dir: str, device: str, rank: int = 0, world: int = 1):
        self.cfg = prof_cfg
        self.device = device
        self.rank = rank
        listed = prof_cfg.profiler_rank is None or rank in prof_cfg.profiler_rank
        records = device != "CPU" or prof_cfg.profile_cpu
        self.enabled = prof_cfg.enable_profiling and listed and records
        base = prof_cfg.output_path or os.path.join(output_dir, "profile")
        self.output_path = os.path.join(base, f"rank_{rank}") if world > 1 else base
        self.profiler = None

    def options(self) -> dict:
        """mindspore.Profiler's arguments for this device (no MindSpore import)."""
        cfg = self.cfg
        if self.device == "CPU":
            return {"activities": ["CPU"], "profile_memory": cfg.profile_memory}
        return {"activities": ["NPU"] + (["CPU"] if cfg.profile_cpu else []), "profiler_level": cfg.profiler_level,
                "with_stack": cfg.with_stack, "profile_memory": cfg.profile_memory, "mstx": cfg.mstx}

    def _make(self):
        import mindspore as ms
        from mindspore.profiler import ProfilerActivity, ProfilerLevel

        kwargs = {"start_profile": False, "output_path": self.output_path, **self.options()}
        kwargs["activities"] = [getattr(ProfilerActivity, a) for a in kwargs["activities"]]
        if "profiler_level" in kwargs:
            kwargs["profiler_level"] = getattr(ProfilerLevel, f"Level{kwargs['profiler_level']}")
        return ms.Profiler(**kwargs)

    def on_step_begin(self, trainer, step):
        if self.enabled and step == self.cfg.start_step and self.profiler is None:
            self.profiler = self._make()
            self.profiler.start()
            log.info("profiler: rank %d records steps %d-%d into %s", self.rank, self.cfg.start_step,
                     self.cfg.end_step, self.output_path)

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
        log.info("profiler: rank %d results in %s", self.rank, self.output_path)
