"""Megatron-compatible indexed datasets, GPT/Blended datasets, preprocessing and a framework-free loader."""

__version__ = "0.1.0"

__all__ = ["__version__"]
