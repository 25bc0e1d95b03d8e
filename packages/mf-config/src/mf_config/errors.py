"""`ConfigError`: the one kind of error mf-config raises for bad input.

Every message is a single line that starts with the full key path of the offending value
(`training.global_batch_size`, `callbacks[0].type`, `swap.layer_swap[0].layers`) or, for problems
with the file itself, the file name. The CLI prints it as is, so it must never span lines.
"""

from __future__ import annotations

import re
from typing import Any

_NO_VALUE = object()
_WHITESPACE = re.compile(r"\s+")
_MAX_VALUE_CHARS = 80


def fmt_value(value: Any) -> str:
    """A short, single-line rendering of a user's value, YAML-flavoured (`null`, not `None`)."""
    text = "null" if value is None else repr(value)
    text = _WHITESPACE.sub(" ", text)
    if len(text) > _MAX_VALUE_CHARS:
        text = text[: _MAX_VALUE_CHARS - 3] + "..."
    return text


def type_name(value: Any) -> str:
    """The YAML-ish name of a value's type, for 'expected X, got Y (type)' messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, dict):
        return "mapping"
    if isinstance(value, (list, tuple)):
        return "list"
    return type(value).__name__


class ConfigError(ValueError):
    """Bad configuration input, reported as one line: `<key path>: <problem>[, got <value>]`.

    `key_path` is the dotted path of the offending key (or the file name for file-level problems),
    `problem` says what is wrong, `value` (when given) is the offending value.
    """

    def __init__(self, key_path: str, problem: str, value: Any = _NO_VALUE):
        self.key_path = key_path
        self.problem = problem
        self.value = None if value is _NO_VALUE else value
        message = f"{key_path}: {problem}" if key_path else problem
        if value is not _NO_VALUE:
            message += f", got {fmt_value(value)}"
        # Messages may quote user text (YAML problems, values): keep them on one line.
        super().__init__(_WHITESPACE.sub(" ", message).strip())
