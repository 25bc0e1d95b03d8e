"""The Trainer: optimizers, LR schedulers, callbacks, metrics, checkpoint/resume glue, fine-tuning (full and
LoRA), evaluation, and the preflight that decides whether a config can run at all.

Importing the package is cheap: the preflight and the errors load at once (no MindSpore), the names
under `TYPE_CHECKING` below on first use (PEP 562, `_LAZY`), so `mf config validate` answers
without a MindSpore start-up while readers and type checkers see where each name comes from.
"""

from typing import TYPE_CHECKING

from mf_trainer.dry_run import DryRun
from mf_trainer.dry_run import dry_run as _dry_run
from mf_trainer.errors import TrainerConfigError, TrainingError
from mf_trainer.preflight import Notice, PreflightError, PreflightReport
from mf_trainer.preflight import preflight as _preflight

__version__ = "0.8.0"

# The functions, not the submodules of the same names (the imports above bound the submodules here;
# imported now, a later `import mf_trainer.dry_run` finds them loaded and leaves these names alone).
preflight = _preflight
dry_run = _dry_run

if TYPE_CHECKING:  # imported on first use at run time (`_LAZY`, the same table)
    from mf_trainer.callbacks import CALLBACKS, Callback, StopAfterLoss, StopAtStep, build_callbacks, register_callback
    from mf_trainer.evaluation import EvalResult, Evaluator, evaluate, evaluated_model
    from mf_trainer.lr_schedulers import SCHEDULERS, LRScheduler, build_scheduler
    from mf_trainer.memory import MemoryPlan, RankMemory, memory_plan
    from mf_trainer.monitor import MetricsLogger
    from mf_trainer.muon import Muon
    from mf_trainer.optimizer import AdamW, build_adamw, build_optimizer
    from mf_trainer.optimizer_options import MuonOptions
    from mf_trainer.step import StepResult
    from mf_trainer.trainer import Trainer, TrainResult, TrainState
    from mf_trainer.weight_decay import DEFAULT_EXCLUDE, decay_mask

__all__ = [
    "CALLBACKS",
    "DEFAULT_EXCLUDE",
    "SCHEDULERS",
    "AdamW",
    "Callback",
    "DryRun",
    "EvalResult",
    "Evaluator",
    "LRScheduler",
    "MemoryPlan",
    "MetricsLogger",
    "Muon",
    "MuonOptions",
    "Notice",
    "PreflightError",
    "PreflightReport",
    "RankMemory",
    "StepResult",
    "StopAfterLoss",
    "StopAtStep",
    "TrainResult",
    "TrainState",
    "Trainer",
    "TrainerConfigError",
    "TrainingError",
    "__version__",
    "build_adamw",
    "build_callbacks",
    "build_optimizer",
    "build_scheduler",
    "decay_mask",
    "dry_run",
    "evaluate",
    "evaluated_model",
    "memory_plan",
    "preflight",
    "register_callback",
]

# name -> module: the TYPE_CHECKING imports above, for run time (tests/test_package.py checks that the
# two say the same).
_LAZY = {
    **{name: "callbacks" for name in ("CALLBACKS", "Callback", "StopAfterLoss", "StopAtStep", "build_callbacks",
                                      "register_callback")},
    **{name: "evaluation" for name in ("EvalResult", "Evaluator", "evaluate", "evaluated_model")},
    **{name: "lr_schedulers" for name in ("SCHEDULERS", "LRScheduler", "build_scheduler")},
    "MetricsLogger": "monitor",
    "AdamW": "optimizer", "build_adamw": "optimizer", "build_optimizer": "optimizer",
    "Muon": "muon", "MuonOptions": "optimizer_options",
    **{name: "trainer" for name in ("Trainer", "TrainResult", "TrainState")},
    "StepResult": "step",
    "DEFAULT_EXCLUDE": "weight_decay", "decay_mask": "weight_decay",
    **{name: "memory" for name in ("MemoryPlan", "RankMemory", "memory_plan")},
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mf_trainer' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"mf_trainer.{module}"), name)
    globals()[name] = value
    return value
