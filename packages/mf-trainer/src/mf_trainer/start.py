"""Where a run's weights come from and what its checkpoints hold, by run_mode: one interface, so
the Trainer has no run_mode branches.

    plan = start_plan(cfg)
    plan.prepare_model(model)        # before the parallel plan: base weights, LoRA adapters
    plan.held(model)                 # names a checkpoint holds (None: every parameter)
    plan.restore_source()            # (path, resume) to restore after the optimizer exists, or None
    plan.common()                    # what this run adds to common.json

`run_mode: train` (`Pretraining`): freshly initialised weights, or `checkpoint.load_path` restored
by checkpointing.py (a resume, or a weights-only start). `run_mode: finetune`: finetune.py. In both,
a committed checkpoint of this same run in `checkpoint.save_path` (rundir.py's "resume" verdict)
wins over load_path: the rerun continues where the run stopped, whatever it started from.
"""

from __future__ import annotations


class Pretraining:
    """run_mode train: the model as initialised; this run's own checkpoint, or else
    checkpoint.load_path, restored later."""

    def __init__(self, cfg, run_directory=None):
        self.load_path = cfg.checkpoint.load_path
        self.own = cfg.checkpoint.save_path if run_directory is not None and run_directory.resumes_own else None

    def prepare_model(self, model) -> None:
        """Nothing before the plan: initialised weights (a load_path is restored into the sharded state)."""

    def held(self, model) -> set[str] | None:
        return None

    def restore_source(self) -> tuple[str | None, bool] | None:
        # (save_path, True): this run's own checkpoint, resumed whole; (None, False):
        # checkpoint.load_path, where checkpointing decides (weights-only or full)
        if self.own:
            return self.own, True
        return (None, False) if self.load_path else None

    def common(self) -> dict:
        return {}


def start_plan(cfg, seed: int, run_directory=None):
    """The plan of `cfg`; `run_directory` (rundir.inspect_run) says whether it resumes itself."""
    if cfg.run_mode == "finetune":
        from mf_trainer.finetune import Finetune

        return Finetune(cfg, seed, run_directory)
    return Pretraining(cfg, run_directory)
