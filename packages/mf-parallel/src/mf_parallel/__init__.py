"""MindSpore parallel runtime: device mesh, collectives, FSDP/HSDP, TP/SP, PP, CP, EP."""

__version__ = "0.1.0"

__all__ = ["__version__"]
