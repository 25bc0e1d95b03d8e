"""DeepSeek-V3 (DeepseekV3ForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import DeepseekV3Args

SPEC = ModelSpec(
    model_type="deepseek_v3",
    architecture="DeepseekV3ForCausalLM",
    args_cls=DeepseekV3Args,
    model_ref="mf_models.deepseek_v3.model:DeepseekV3ForCausalLM",
    parallelize_ref="mf_models.deepseek_v3.parallelize:parallelize_deepseek_v3",
    inventory=DecoderInventory(attention="mla", expert_bias=True),
    tiny=dict(num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
              topk_group=1, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24,
              qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8),
)
