"""GLM-4.5 (Glm4MoeForCausalLM): GQA with partial RoPE and optional q/k norms, DeepSeek-V3's MoE and
multi-token prediction.

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import Glm4MoeArgs

__all__ = ["Glm4MoeArgs", "Glm4MoeForCausalLM"]


def __getattr__(name: str):
    if name == "Glm4MoeForCausalLM":
        from .model import Glm4MoeForCausalLM

        return Glm4MoeForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
