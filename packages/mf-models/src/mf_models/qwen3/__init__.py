"""Qwen3 (Qwen3ForCausalLM)."""

from .args import Qwen3Args
from .model import Qwen3ForCausalLM

__all__ = ["Qwen3Args", "Qwen3ForCausalLM"]
