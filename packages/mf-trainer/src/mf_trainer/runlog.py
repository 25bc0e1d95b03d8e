"""`<output_dir>/train.log`: the console lines of the run, timestamped, every session appended.

The Trainer starts a `RunLog` first thing in its constructor: the records of the mf loggers are
kept in memory until `open(output_dir)` (called by `train()`, the first moment anything may be
written: a refused config writes nothing), then written to the file and followed live until
`close()`. Each session starts with a header line, so a resumed run's log reads as one story:

    2026-12-01 17:30:53 ==== mf train session: step 200 of 300 (resumed) ====
    2026-12-01 17:30:53 [mf_trainer] step 201/300 (67.0%) | loss 4.6120 | ...

Rank 0 alone writes it (the other ranks' console goes to mf launch's logs/worker_<rank>.log).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

LOGGERS = ("mf_trainer", "mf_data", "mf_models", "mf_ckpt", "mf_parallel")
FORMAT = "%(asctime)s [%(name)s] %(message)s"
DATE = "%Y-%m-%d %H:%M:%S"


class _Buffer(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class RunLog:
    """Timestamped copy of the mf loggers' INFO+ lines into train.log (see the module docstring)."""

    def __init__(self) -> None:
        self._buffer: _Buffer | None = _Buffer()
        self._file: logging.FileHandler | None = None
        self._levels: dict[str, int] = {}
        for name in LOGGERS:
            logger = logging.getLogger(name)
            if logger.getEffectiveLevel() > logging.INFO:   # the lines must exist to be copied
                self._levels[name] = logger.level
                logger.setLevel(logging.INFO)
            logger.addHandler(self._buffer)

    @property
    def path(self) -> str | None:
        return self._file.baseFilename if self._file is not None else None

    def open(self, output_dir: str | os.PathLike, header: str) -> None:
        """Start writing `<output_dir>/train.log` (appending): a header, the buffered lines, then live."""
        if self._file is not None or self._buffer is None:
            return
        handler = logging.FileHandler(Path(output_dir) / "train.log", mode="a", encoding="utf-8")
        handler.setLevel(logging.INFO)
        handler.setFormatter(logging.Formatter(FORMAT, DATE))
        began = self._buffer.records[0].created if self._buffer.records else time.time()
        handler.stream.write(f"{time.strftime(DATE, time.localtime(began))} ==== {header} ====\n")
        for record in self._buffer.records:
            handler.handle(record)
        for name in LOGGERS:
            logging.getLogger(name).removeHandler(self._buffer)
            logging.getLogger(name).addHandler(handler)
        self._buffer = None
        self._file = handler

    def close(self) -> None:
        for name in LOGGERS:
            logger = logging.getLogger(name)
            for handler in (self._buffer, self._file):
                if handler is not None:
                    logger.removeHandler(handler)
            if name in self._levels:
                logger.setLevel(self._levels[name])
        if self._file is not None:
            self._file.close()
        self._buffer = self._file = None
