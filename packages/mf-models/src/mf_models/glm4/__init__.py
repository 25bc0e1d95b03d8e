"""GLM-4 (Glm4ForCausalLM): GQA with q/k/v biases, partial interleaved RoPE, post-attention and
post-MLP norms.

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import Glm4Args

__all__ = ["Glm4Args", "Glm4ForCausalLM"]


def __getattr__(name: str):
    if name == "Glm4ForCausalLM":
        from .model import Glm4ForCausalLM

        return Glm4ForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
