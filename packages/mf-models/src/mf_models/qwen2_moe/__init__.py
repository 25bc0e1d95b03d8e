"""Qwen2-MoE (Qwen2MoeForCausalLM): Qwen2 attention, sparse MoE with a gated shared expert.

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import Qwen2MoeArgs

__all__ = ["Qwen2MoeArgs", "Qwen2MoeForCausalLM"]


def __getattr__(name: str):
    if name == "Qwen2MoeForCausalLM":
        from .model import Qwen2MoeForCausalLM

        return Qwen2MoeForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
