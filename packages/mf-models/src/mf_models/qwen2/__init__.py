"""Qwen2 (Qwen2ForCausalLM).

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import Qwen2Args

__all__ = ["Qwen2Args", "Qwen2ForCausalLM"]


def __getattr__(name: str):
    if name == "Qwen2ForCausalLM":
        from .model import Qwen2ForCausalLM

        return Qwen2ForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
