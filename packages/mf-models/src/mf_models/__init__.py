"""Model registry and definitions (llama, qwen3, deepseek_v3) with per-model parallel plans and generation."""

__version__ = "0.1.0"

__all__ = ["__version__"]
