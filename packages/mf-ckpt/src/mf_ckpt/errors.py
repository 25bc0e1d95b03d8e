"""The one exception type mf-ckpt raises for bad input.

Every message is a single line that names the file or tensor involved, so the CLI can print it as
is and a trainer log stays readable. Programming errors (wrong argument types from a caller) are
ordinary TypeError/ValueError and are not wrapped.
"""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint, Hugging Face directory or request that cannot be honoured (one-line message)."""

    def __init__(self, message: str):
        # Keep messages on one line whatever the source (e.g. a wrapped safetensors error).
        super().__init__(" ".join(str(message).split()))


def first_few(names, limit: int = 3) -> str:
    """`'a', 'b', 'c' (and 4 more)` for error messages about many names."""
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:limit])
    if len(names) > limit:
        shown += f" (and {len(names) - limit} more)"
    return shown


def brief(value, limit: int = 60) -> str:
    """repr(value), cut to `limit` characters: a crafted file must not fill an error line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
