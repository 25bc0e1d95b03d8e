"""Qwen3 (Qwen3ForCausalLM).

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import Qwen3Args

__all__ = ["Qwen3Args", "Qwen3ForCausalLM"]


def __getattr__(name: str):
    if name == "Qwen3ForCausalLM":
        from .model import Qwen3ForCausalLM

        return Qwen3ForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
