"""Qwen2-MoE (Qwen2MoeForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import Qwen2MoeArgs

SPEC = ModelSpec(
    model_type="qwen2_moe",
    architecture="Qwen2MoeForCausalLM",
    args_cls=Qwen2MoeArgs,
    model_ref="mf_models.qwen2_moe.model:Qwen2MoeForCausalLM",
    parallelize_ref="mf_models.qwen2_moe.parallelize:parallelize_qwen2_moe",
    inventory=DecoderInventory(attention="gqa", shared_gate=True),
    tiny=dict(num_key_value_heads=2, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
              shared_expert_intermediate_size=24, mlp_only_layers=[0]),
)
