"""Sharded safetensors checkpoints: save, reshard-on-load, inspect, merge and Hugging Face conversion."""

__version__ = "0.1.0"

__all__ = ["__version__"]
