"""The Trainer: optimizers, LR schedulers, callbacks, metrics, checkpoint/resume glue, fine-tuning (full and
LoRA) and evaluation."""

from mf_trainer.callbacks import CALLBACKS, Callback, StopAfterLoss, StopAtStep, build_callbacks, register_callback
from mf_trainer.errors import TrainerConfigError, TrainingError
from mf_trainer.evaluation import EvalResult, Evaluator, evaluate
from mf_trainer.lr_schedulers import SCHEDULERS, LRScheduler, build_scheduler
from mf_trainer.monitor import MetricsLogger
from mf_trainer.optimizer import AdamW, build_adamw
from mf_trainer.trainer import Trainer, TrainResult, TrainState
from mf_trainer.weight_decay import DEFAULT_EXCLUDE, decay_mask

__version__ = "0.3.1"

__all__ = [
    "CALLBACKS",
    "DEFAULT_EXCLUDE",
    "SCHEDULERS",
    "AdamW",
    "Callback",
    "EvalResult",
    "Evaluator",
    "LRScheduler",
    "MetricsLogger",
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
    "build_scheduler",
    "decay_mask",
    "evaluate",
    "register_callback",
]
