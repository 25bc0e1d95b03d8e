"""GLM-4-9B / ChatGLM (GlmForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import GlmArgs

SPEC = ModelSpec(
    model_type="glm",
    architecture="GlmForCausalLM",
    args_cls=GlmArgs,
    model_ref="mf_models.glm.model:GlmForCausalLM",
    parallelize_ref="mf_models.glm.parallelize:parallelize_glm",
    inventory=DecoderInventory(attention="gqa"),
    tiny=dict(num_key_value_heads=2, head_dim=12),
)
