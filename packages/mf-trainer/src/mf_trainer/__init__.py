"""The Trainer: optimizers, LR schedulers, callbacks, metrics and checkpoint/resume glue."""

__version__ = "0.1.0"

__all__ = ["__version__"]
