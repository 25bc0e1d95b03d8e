"""Mixtral (MixtralForCausalLM): sparse MoE with a softmax top-k router."""

from .args import MixtralArgs
from .model import MixtralForCausalLM

__all__ = ["MixtralArgs", "MixtralForCausalLM"]
