"""Errors that the `mf` command reports as one line with exit code 2."""


class UsageError(Exception):
    """Bad input from the user: a bad YAML, a missing file, a wrong argument."""
