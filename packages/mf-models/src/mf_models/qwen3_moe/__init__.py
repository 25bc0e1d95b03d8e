"""Qwen3-MoE (Qwen3MoeForCausalLM): Qwen3 attention with sparse MoE layers."""

from .args import Qwen3MoeArgs
from .model import Qwen3MoeForCausalLM

__all__ = ["Qwen3MoeArgs", "Qwen3MoeForCausalLM"]
