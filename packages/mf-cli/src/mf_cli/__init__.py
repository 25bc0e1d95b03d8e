"""The `mf` command: a thin composition of the mf packages."""

__version__ = "0.5.1"

__all__ = ["__version__"]
