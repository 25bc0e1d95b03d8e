"""Errors raised for bad model configuration or bad weights: one clear line each."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ModelConfigError(ValueError):
    """A `model` section (or HF config.json) that cannot build a model.

    The message is one line naming the offending key (as `model.<key>`), the bad value and what is
    accepted, so the CLI can print it as is.
    """


class ModelStateError(ValueError):
    """A weight dict that does not match the model: missing, unexpected or mis-shaped names."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` did you mean 'x'?` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" did you mean {close[0]!r}?" if close else ""
