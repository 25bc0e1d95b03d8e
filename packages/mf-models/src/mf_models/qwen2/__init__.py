"""Qwen2 (Qwen2ForCausalLM)."""

from .args import Qwen2Args
from .model import Qwen2ForCausalLM

__all__ = ["Qwen2Args", "Qwen2ForCausalLM"]
