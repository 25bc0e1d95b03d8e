"""The background thread that writes snapshots for `async_save`.

One worker, so saves are written in order; its Future carries any exception back to the commit
step, which reports it on every rank (a failed async save is never silently dropped).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class AsyncWriter:
    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[[], Any]) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mf-ckpt-writer")
        return self._pool.submit(fn)

    def shutdown(self) -> None:
        """Wait for the running write (never abandon a half-written file) and stop the thread."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
