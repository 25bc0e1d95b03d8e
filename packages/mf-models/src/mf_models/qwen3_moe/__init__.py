"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3 attention with sparse MoE layers.

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import Qwen3MoeArgs

__all__ = ["Qwen3MoeArgs", "Qwen3MoeForCausalLM"]


def __getattr__(name: str):
    if name == "Qwen3MoeForCausalLM":
        from .model import Qwen3MoeForCausalLM

        return Qwen3MoeForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
