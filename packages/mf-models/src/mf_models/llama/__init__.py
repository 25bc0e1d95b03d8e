"""Llama (LlamaForCausalLM)."""

from .args import LlamaArgs
from .model import LlamaForCausalLM

__all__ = ["LlamaArgs", "LlamaForCausalLM"]
