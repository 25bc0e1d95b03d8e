"""Qwen3 (Qwen3ForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import Qwen3Args

SPEC = ModelSpec(
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    args_cls=Qwen3Args,
    model_ref="mf_models.qwen3.model:Qwen3ForCausalLM",
    parallelize_ref="mf_models.qwen3.parallelize:parallelize_qwen3",
    inventory=DecoderInventory(attention="gqa", qk_norm=True),
    tiny=dict(num_key_value_heads=2, head_dim=12),
)
