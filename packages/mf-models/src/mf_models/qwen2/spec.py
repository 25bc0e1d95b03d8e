"""Qwen2 (Qwen2ForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import Qwen2Args

SPEC = ModelSpec(
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    args_cls=Qwen2Args,
    model_ref="mf_models.qwen2.model:Qwen2ForCausalLM",
    parallelize_ref="mf_models.qwen2.parallelize:parallelize_qwen2",
    inventory=DecoderInventory(attention="gqa"),
    tiny=dict(num_key_value_heads=2),
)
