"""DeepSeek-V3 (DeepseekV3ForCausalLM): MLA + MoE.

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import DeepseekV3Args

__all__ = ["DeepseekV3Args", "DeepseekV3ForCausalLM"]


def __getattr__(name: str):
    if name == "DeepseekV3ForCausalLM":
        from .model import DeepseekV3ForCausalLM

        return DeepseekV3ForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
