"""Where a run's weights come from and what its checkpoints hold, by run_mode: one interface, so
the Trainer has no run_mode branches.

    plan = start_plan(cfg)
    plan.prepare_model(model)        # before the parallel plan: base weights, LoRA adapters
    plan.held(model)                 # names a checkpoint holds (None: every parameter)
    plan.restore_source()            # (path, resume) to restore after the optimizer exists, or None
    plan.common()                    # what this run adds to common.json

`run_mode: train` (`Pretraining`): freshly initialised weights, or `checkpoint.load_path` restored
by checkpointing.py (a resume, or a weights-only start). `run_mode: finetune`: finetune.py.
"""

from __future__ import annotations


class Pretraining:
    """run_mode train: the model as initialised; checkpoint.load_path, if any, restored later."""

    def __init__(self, cfg):
        self.load_path = cfg.checkpoint.load_path

    def prepare_model(self, model) -> None:
        """Nothing before the plan: initialised weights (a load_path is restored into the sharded state)."""

    def held(self, model) -> set[str] | None:
        return None

    def restore_source(self) -> tuple[str | None, bool] | None:
        # path None: checkpoint.load_path; resume False: checkpointing decides (weights-only or full)
        return (None, False) if self.load_path else None

    def common(self) -> dict:
        return {}


def start_plan(cfg, seed: int):
    if cfg.run_mode == "finetune":
        from mf_trainer.finetune import Finetune

        return Finetune(cfg, seed)
    return Pretraining(cfg)
