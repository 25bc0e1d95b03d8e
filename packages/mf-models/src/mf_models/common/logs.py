"""Logging that says a device fallback once per process, not once per layer or per step."""

from __future__ import annotations

import logging

logger = logging.getLogger("mf_models")
_said: set[str] = set()


def log_once(message: str, level: int = logging.WARNING) -> None:
    if message in _said:
        return
    _said.add(message)
    logger.log(level, message)
