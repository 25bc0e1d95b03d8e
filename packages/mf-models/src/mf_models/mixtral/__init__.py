"""Mixtral (MixtralForCausalLM): sparse MoE with a softmax top-k router.

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import MixtralArgs

__all__ = ["MixtralArgs", "MixtralForCausalLM"]


def __getattr__(name: str):
    if name == "MixtralForCausalLM":
        from .model import MixtralForCausalLM

        return MixtralForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
