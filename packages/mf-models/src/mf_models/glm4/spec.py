"""GLM-4-0414 (Glm4ForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.model_spec import ModelSpec
from .args import Glm4Args
from .inventory import Glm4Inventory

SPEC = ModelSpec(
    model_type="glm4",
    architecture="Glm4ForCausalLM",
    args_cls=Glm4Args,
    model_ref="mf_models.glm4.model:Glm4ForCausalLM",
    parallelize_ref="mf_models.glm4.parallelize:parallelize_glm4",
    inventory=Glm4Inventory(),
    tiny=dict(num_key_value_heads=2, head_dim=12),
)
