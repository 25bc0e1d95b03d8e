"""Llama (LlamaForCausalLM).

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import LlamaArgs

__all__ = ["LlamaArgs", "LlamaForCausalLM"]


def __getattr__(name: str):
    if name == "LlamaForCausalLM":
        from .model import LlamaForCausalLM

        return LlamaForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
