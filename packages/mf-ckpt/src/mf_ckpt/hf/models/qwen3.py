"""Qwen3 (Qwen3ForCausalLM) <-> mf names: llama's layout plus per-head q/k RMSNorm, no MLP bias."""

from __future__ import annotations

from ..rules import Architecture, Rule
from . import llama

# transformers' Qwen3Config defaults (head_dim defaults to 128 there, not hidden/heads).
DEFAULTS = {"tie_word_embeddings": False, "attention_bias": False}

QK_NORM = (
    Rule("attention.q_norm.weight", "self_attn.q_norm.weight", ("hd",)),
    Rule("attention.k_norm.weight", "self_attn.k_norm.weight", ("hd",)),
)

# Qwen3's MLP is never biased (the config has no mlp_bias).
MLP = tuple(r for r in llama.MLP if "mlp_bias" not in r.when)

ARCH = Architecture(
    model_type="qwen3",
    hf_class="Qwen3ForCausalLM",
    defaults=DEFAULTS,
    dims=lambda c: llama.dense_dims(c, default_head_dim=128),
    conditions=lambda c: {
        "untied": not c.bool("tie_word_embeddings"),
        "attention_bias": c.bool("attention_bias"),
    },
    layer_conditions=lambda c, i: {},
    top=llama.TOP,
    layer=llama.ATTENTION + QK_NORM + MLP,
    skipped=llama.skip_rotary_buffers,
)
