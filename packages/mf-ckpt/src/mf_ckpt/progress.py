"""Progress bars for the CLI and tools: tqdm on stderr, shown only once a task passes one second."""

from __future__ import annotations


class Progress:
    """A byte counter; a tqdm bar when `enabled` (tqdm's `delay` hides it for short tasks)."""

    def __init__(self, total: int, desc: str, *, enabled: bool = False):
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, delay=1.0,
                             leave=False, dynamic_ncols=True)

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
