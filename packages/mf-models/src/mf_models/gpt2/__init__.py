"""GPT-2 (GPT2LMHeadModel): learned positions, LayerNorm, biased MHA, GELU MLP, tied head.

The args class imports without MindSpore (config checks use it); the model class loads on first use.
"""

from .args import Gpt2Args

__all__ = ["Gpt2Args", "Gpt2LMHeadModel"]


def __getattr__(name: str):
    if name == "Gpt2LMHeadModel":
        from .model import Gpt2LMHeadModel

        return Gpt2LMHeadModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
