"""GLM-4 (Glm4ForCausalLM, GLM-4-0414) <-> mf names: Llama's attention (q/k/v biases when
`attention_bias`, never on o_proj), two more RMSNorms per layer (after the attention and after the
MLP: mf's `attention_post_norm` / `ffn_post_norm`), and the MLP's gate and up projections packed
into one `mlp.gate_up_proj` [2 I, H] (gate first), unpacked into mf's w1 / w3 and packed back."""

from __future__ import annotations

from ..rules import Architecture, Packed, Rule
from . import llama

# transformers' Glm4Config defaults for keys a config.json may omit.
DEFAULTS = {"tie_word_embeddings": False, "attention_bias": True}

ATTENTION = tuple(r for r in llama.ATTENTION if r.mf != "attention.wo.bias") + (
    Rule("attention_post_norm.weight", "post_self_attn_layernorm.weight", ("H",)),
)

MLP = (
    Rule("ffn_norm.weight", "post_attention_layernorm.weight", ("H",)),
    Rule("feed_forward.w2.weight", "mlp.down_proj.weight", ("H", "I")),
    Rule("ffn_post_norm.weight", "post_mlp_layernorm.weight", ("H",)),
)

PACKED = (
    Packed("mlp.gate_up_proj.weight", (Rule("feed_forward.w1.weight", "", ("I", "H")),
                                       Rule("feed_forward.w3.weight", "", ("I", "H"))), axis=0),
)

ARCH = Architecture(
    model_type="glm4",
    hf_class="Glm4ForCausalLM",
    defaults=DEFAULTS,
    dims=lambda c: llama.dense_dims(c, default_head_dim=128),
    conditions=lambda c: {"untied": not c.bool("tie_word_embeddings"), "attention_bias": c.bool("attention_bias")},
    layer_conditions=lambda c, i: {},
    top=llama.TOP,
    layer=ATTENTION + MLP,
    packed=PACKED,
    skipped=llama.skip_rotary_buffers,
)
