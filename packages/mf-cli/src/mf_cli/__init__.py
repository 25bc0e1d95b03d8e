"""The `mf` command: a thin composition of the mf packages."""

__version__ = "0.11.0"

__all__ = ["__version__"]
