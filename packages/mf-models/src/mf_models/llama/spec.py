"""Llama (LlamaForCausalLM)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.inventory import DecoderInventory
from ..common.model_spec import ModelSpec
from .args import LlamaArgs

SPEC = ModelSpec(
    model_type="llama",
    architecture="LlamaForCausalLM",
    args_cls=LlamaArgs,
    model_ref="mf_models.llama.model:LlamaForCausalLM",
    parallelize_ref="mf_models.llama.parallelize:parallelize_llama",
    inventory=DecoderInventory(attention="gqa"),
    tiny=dict(num_key_value_heads=2),
)
