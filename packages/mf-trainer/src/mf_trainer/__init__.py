"""The Trainer: optimizers, LR schedulers, callbacks, metrics, checkpoint/resume glue, fine-tuning (full and
LoRA), evaluation, and the preflight that decides whether a config can run at all.

Importing the package is cheap: the preflight and the errors load at once (no MindSpore), the rest
on first use (PEP 562), so `mf config validate` answers without a MindSpore start-up.
"""

from mf_trainer.errors import TrainerConfigError, TrainingError
from mf_trainer.preflight import Notice, PreflightError, PreflightReport
from mf_trainer.preflight import preflight as _preflight

__version__ = "0.8.0"

# The function, not the subpackage of the same name (the import above bound the subpackage here).
preflight = _preflight

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
    "DryRun": "dry_run", "dry_run": "dry_run",
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
