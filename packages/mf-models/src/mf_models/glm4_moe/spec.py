"""GLM-4.5 (Glm4MoeForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import Glm4MoeArgs

SPEC = ModelSpec(
    model_type="glm4_moe",
    architecture="Glm4MoeForCausalLM",
    args_cls=Glm4MoeArgs,
    model_ref="mf_models.glm4_moe.model:Glm4MoeForCausalLM",
    parallelize_ref="mf_models.glm4_moe.parallelize:parallelize_glm4_moe",
    inventory=DecoderInventory(attention="gqa", qk_norm="use_qk_norm", expert_bias=True),
    tiny=dict(num_key_value_heads=2, head_dim=12, moe_intermediate_size=16, n_routed_experts=4, num_experts_per_tok=2,
              n_shared_experts=1, first_k_dense_replace=1, num_nextn_predict_layers=0, use_qk_norm=True,
              attention_bias=True),
)
