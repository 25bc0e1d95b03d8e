"""Mixtral (MixtralForCausalLM) <-> mf names: llama's attention (no biases) and a sparse MoE in
every layer, one HF tensor per expert (`block_sparse_moe.experts.{e}.w1.weight`, the layout
transformers saves) stacked into mf's `moe.experts.w1` [E, I, H] (w1 = gate, w3 = up, w2 = down)."""

from __future__ import annotations

from ..rules import Architecture, ConfigView, Rule
from . import llama

DEFAULTS = {"tie_word_embeddings": False}

ATTENTION = tuple(r for r in llama.ATTENTION if "attention_bias" not in r.when)

MOE = (
    Rule("ffn_norm.weight", "post_attention_layernorm.weight", ("H",)),
    Rule("moe.router.gate.weight", "block_sparse_moe.gate.weight", ("E", "H")),
    Rule("moe.experts.w1", "block_sparse_moe.experts.{e}.w1.weight", ("E", "I", "H"), experts=True),
    Rule("moe.experts.w2", "block_sparse_moe.experts.{e}.w2.weight", ("E", "H", "I"), experts=True),
    Rule("moe.experts.w3", "block_sparse_moe.experts.{e}.w3.weight", ("E", "I", "H"), experts=True),
)


def dims(c: ConfigView) -> dict[str, int]:
    return {**llama.dense_dims(c), "E": c.int("num_local_experts")}


ARCH = Architecture(
    model_type="mixtral",
    hf_class="MixtralForCausalLM",
    defaults=DEFAULTS,
    dims=dims,
    conditions=lambda c: {"untied": not c.bool("tie_word_embeddings")},
    layer_conditions=lambda c, i: {},
    top=llama.TOP,
    layer=ATTENTION + MOE,
    skipped=llama.skip_rotary_buffers,
)
