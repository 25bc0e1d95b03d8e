"""Writing files so that a crash never leaves a half-written file under the final name."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import IO, Any


def tmp_path_beside(path: str) -> str:
    """A unique hidden name in the same directory (same filesystem, so `os.replace` is atomic)."""
    directory, base = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{base}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write(path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Call `write(f)` on a temporary file, sync it, then rename it to `path`."""
    tmp = tmp_path_beside(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str, data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data))
