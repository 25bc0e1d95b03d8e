"""Exceptions raised by mf-data.

Every error meant for a user carries one line that names the file, field or value at fault, so
the `mf-data` command (and the `mf` trainer) can print it as-is and exit with status 2 instead of
showing a traceback. They all derive from `MFDataError`; the subclasses also derive from the
built-in exception a caller would naturally catch (`ValueError`, `FileNotFoundError`, ...).
"""

from __future__ import annotations


class MFDataError(Exception):
    """Base class of every error mf-data raises on bad input."""


class DataFileError(MFDataError, ValueError):
    """A `.bin`/`.idx` pair (or an index cache file) is missing, truncated or malformed."""


class DataFileNotFoundError(DataFileError, FileNotFoundError):
    """A file that must exist does not."""


class DatasetConfigError(MFDataError, ValueError):
    """A dataset or loader setting is invalid, inconsistent, or cannot be honoured."""


class DatasetTooSmallError(MFDataError, ValueError):
    """A split has no documents, or too few tokens for what was requested of it."""


class CacheTimeoutError(MFDataError, TimeoutError):
    """A rank that does not build the index cache gave up waiting for the building rank."""


class InputError(MFDataError, ValueError):
    """Bad input to a command-line tool (corpus line, tokenizer model, output path, ...)."""
