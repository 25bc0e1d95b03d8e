"""GLM (GlmForCausalLM): GLM-4-9B, the ChatGLM architecture (GQA with q/k/v biases, partial
interleaved RoPE, SwiGLU, pre-norm blocks).

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import GlmArgs

__all__ = ["GlmArgs", "GlmForCausalLM"]


def __getattr__(name: str):
    if name == "GlmForCausalLM":
        from .model import GlmForCausalLM

        return GlmForCausalLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
