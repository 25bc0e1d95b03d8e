"""Qwen3-MoE (Qwen3MoeForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import Qwen3MoeArgs

SPEC = ModelSpec(
    model_type="qwen3_moe",
    architecture="Qwen3MoeForCausalLM",
    args_cls=Qwen3MoeArgs,
    model_ref="mf_models.qwen3_moe.model:Qwen3MoeForCausalLM",
    parallelize_ref="mf_models.qwen3_moe.parallelize:parallelize_qwen3_moe",
    inventory=DecoderInventory(attention="gqa", qk_norm=True),
    tiny=dict(num_key_value_heads=2, head_dim=12, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
              norm_topk_prob=True, mlp_only_layers=[0]),
)
