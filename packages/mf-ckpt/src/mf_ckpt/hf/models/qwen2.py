"""Qwen2 (Qwen2ForCausalLM) <-> mf names: llama's layout with q/k/v biases always present and no
o_proj or MLP biases (Qwen2's config has no bias switches)."""

from __future__ import annotations

from ..rules import Architecture, Rule
from . import llama

DEFAULTS = {"tie_word_embeddings": False}

ATTENTION = tuple(r for r in llama.ATTENTION if "attention_bias" not in r.when) + (
    Rule("attention.wq.bias", "self_attn.q_proj.bias", ("Q",)),
    Rule("attention.wk.bias", "self_attn.k_proj.bias", ("KV",)),
    Rule("attention.wv.bias", "self_attn.v_proj.bias", ("KV",)),
)
MLP = tuple(r for r in llama.MLP if "mlp_bias" not in r.when)

ARCH = Architecture(
    model_type="qwen2",
    hf_class="Qwen2ForCausalLM",
    defaults=DEFAULTS,
    dims=llama.dense_dims,
    conditions=lambda c: {"untied": not c.bool("tie_word_embeddings")},
    layer_conditions=lambda c, i: {},
    top=llama.TOP,
    layer=ATTENTION + MLP,
    skipped=llama.skip_rotary_buffers,
)
