"""GPT-2 (GPT2LMHeadModel)'s declaration: what the registry knows of it (no MindSpore here)."""

from ..common.model_spec import ModelSpec
from .args import Gpt2Args
from .inventory import Gpt2Inventory

SPEC = ModelSpec(
    model_type="gpt2",
    architecture="GPT2LMHeadModel",
    args_cls=Gpt2Args,
    model_ref="mf_models.gpt2.model:GPT2LMHeadModel",
    parallelize_ref="mf_models.gpt2.parallelize:parallelize_gpt2",
    inventory=Gpt2Inventory(),
    tiny=dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
)
