"""Mixtral (MixtralForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import MixtralArgs

SPEC = ModelSpec(
    model_type="mixtral",
    architecture="MixtralForCausalLM",
    args_cls=MixtralArgs,
    model_ref="mf_models.mixtral.model:MixtralForCausalLM",
    parallelize_ref="mf_models.mixtral.parallelize:parallelize_mixtral",
    inventory=DecoderInventory(attention="gqa"),
    tiny=dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, intermediate_size=16),
)
