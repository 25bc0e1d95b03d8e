"""DeepSeek-V3 (DeepseekV3ForCausalLM): MLA + MoE."""

from .args import DeepseekV3Args
from .model import DeepseekV3ForCausalLM

__all__ = ["DeepseekV3Args", "DeepseekV3ForCausalLM"]
