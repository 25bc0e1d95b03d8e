"""The one exception type bad parallel settings raise."""

from __future__ import annotations


class ParallelConfigError(ValueError):
    """A parallel layout that cannot work; the message is one line that says how to fix it."""
