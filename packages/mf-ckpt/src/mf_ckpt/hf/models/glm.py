"""GLM (GlmForCausalLM, GLM-4-9B) <-> mf names: GLM-4's rules (glm4.py: q/k/v biases, the MLP's
gate and up packed in `mlp.gate_up_proj`) without GLM-4-0414's post-attention / post-MLP norms."""

from __future__ import annotations

from ..rules import Architecture
from . import glm4, llama

ARCH = Architecture(
    model_type="glm",
    hf_class="GlmForCausalLM",
    defaults=glm4.DEFAULTS,
    dims=lambda c: llama.dense_dims(c, default_head_dim=128),
    conditions=lambda c: {"untied": not c.bool("tie_word_embeddings"), "attention_bias": c.bool("attention_bias")},
    layer_conditions=lambda c, i: {},
    top=llama.TOP,
    layer=tuple(r for r in glm4.ATTENTION if "post_self_attn" not in r.hf)
    + tuple(r for r in glm4.MLP if "post_mlp" not in r.hf),
    packed=glm4.PACKED,
    skipped=llama.skip_rotary_buffers,
)
