"""The mf loggers' progress lines on the console (`mf train`: stdout; `mf eval`: stderr, whose
stdout is the result)."""

from __future__ import annotations

import logging
import sys


class CurrentStream(logging.StreamHandler):
    """Writes to whatever sys.stdout / sys.stderr is when a record is emitted (a caller, or a test,
    may have replaced them since the handler was installed)."""

    def __init__(self, name: str):
        super().__init__()
        self.stream_name = name

    @property
    def stream(self):
        return getattr(sys, self.stream_name)

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ assigns it; the property decides
        pass


def is_console(handler: logging.Handler) -> bool:
    return (type(handler) is logging.StreamHandler
            and getattr(handler, "stream", None) in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__))


def progress_logging(stream_name: str = "stdout") -> None:
    """Progress lines of the mf loggers on stdout (`mf train`) or stderr (`mf eval`, whose stdout is the result)."""
    handler = CurrentStream(stream_name)
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for name in ("mf_trainer", "mf_data", "mf_models", "mf_ckpt"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        for old in [h for h in logger.handlers if isinstance(h, CurrentStream)]:
            logger.removeHandler(old)
        # A console handler of the user's (a plain StreamHandler on stdout / stderr) stays the
        # console; any other handler (a file, train.log, a test's log capture) is not a console.
        if not any(is_console(h) for h in logger.handlers):
            logger.addHandler(handler)
        logger.propagate = False
