"""Errors the Trainer raises, split by who is at fault.

`TrainerConfigError` is bad input (a YAML field the Trainer cannot honour, a pattern that matches
nothing, an unknown scheduler key): the CLI prints its one-line message and exits 2.
`TrainingError` is a failure while training (too many non-finite steps in a row, a failed save):
the CLI exits 1.
"""

from __future__ import annotations


class TrainerConfigError(ValueError):
    """Bad input that the Trainer detected; the message is one line naming the key path."""


class TrainingError(RuntimeError):
    """Training started and then failed."""
