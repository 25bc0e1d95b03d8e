"""Qwen3-MoE (Qwen3MoeForCausalLM) <-> mf names: qwen3's attention; in MoE layers a router
(`mlp.gate.weight`) and one HF tensor per expert (`mlp.experts.{e}.gate_proj.weight`) stacked into
`moe.experts.w1` [E, I_moe, H]; transformers-5 fused expert tensors are read too. Layer i is MoE
when i is not in `mlp_only_layers`, num_experts > 0 and (i + 1) % decoder_sparse_step == 0 (HF's
rule); other layers have a dense MLP (`mlp.gate_proj`, ...)."""

from __future__ import annotations

from ...errors import CheckpointError
from ..rules import Architecture, ConfigView, Fused, Rule
from . import llama, qwen3

DEFAULTS = {"tie_word_embeddings": False, "attention_bias": False, "decoder_sparse_step": 1,
            "moe_intermediate_size": 768, "num_experts": 128}

FFN = (
    Rule("ffn_norm.weight", "post_attention_layernorm.weight", ("H",)),
    Rule("feed_forward.w1.weight", "mlp.gate_proj.weight", ("I", "H"), when=("dense",)),
    Rule("feed_forward.w2.weight", "mlp.down_proj.weight", ("H", "I"), when=("dense",)),
    Rule("feed_forward.w3.weight", "mlp.up_proj.weight", ("I", "H"), when=("dense",)),
    Rule("moe.router.gate.weight", "mlp.gate.weight", ("E", "H"), when=("moe",)),
    Rule("moe.experts.w1", "mlp.experts.{e}.gate_proj.weight", ("E", "Im", "H"), when=("moe",), experts=True),
    Rule("moe.experts.w2", "mlp.experts.{e}.down_proj.weight", ("E", "H", "Im"), when=("moe",), experts=True),
    Rule("moe.experts.w3", "mlp.experts.{e}.up_proj.weight", ("E", "Im", "H"), when=("moe",), experts=True),
)

FUSED = (
    Fused("mlp.experts.gate_up_proj", ("moe.experts.w1", "moe.experts.w3"), axis=1),
    Fused("mlp.experts.down_proj", ("moe.experts.w2",), axis=1),
)


def num_experts(c: ConfigView) -> int:
    """`num_experts`, or `num_local_experts` (transformers 5's canonical name); they must agree."""
    values = {k: c.raw[k] for k in ("num_experts", "num_local_experts") if c.raw.get(k) is not None}
    if len(set(map(repr, values.values()))) > 1:
        raise CheckpointError(f"config.json ({c.model_type}): num_experts and num_local_experts disagree: {values}")
    key = next(iter(values), "num_experts")
    return c.int(key, minimum=0)


def mlp_only_layers(c: ConfigView) -> set[int]:
    layers = c.raw.get("mlp_only_layers") or []
    if not isinstance(layers, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
        raise CheckpointError(f"config.json ({c.model_type}): mlp_only_layers must be a list of layer indices, got {layers!r}")
    return set(layers)


def dims(c: ConfigView) -> dict[str, int]:
    return {**llama.dense_dims(c), "E": num_experts(c), "Im": c.int("moe_intermediate_size")}


def layer_conditions(c: ConfigView, i: int) -> dict[str, bool]:
    moe = i not in mlp_only_layers(c) and num_experts(c) > 0 and (i + 1) % c.int("decoder_sparse_step") == 0
    return {"moe": moe, "dense": not moe}


ARCH = Architecture(
    model_type="qwen3_moe",
    hf_class="Qwen3MoeForCausalLM",
    defaults=DEFAULTS,
    dims=dims,
    conditions=lambda c: {"untied": not c.bool("tie_word_embeddings"), "attention_bias": c.bool("attention_bias")},
    layer_conditions=layer_conditions,
    top=llama.TOP,
    layer=llama.ATTENTION + qwen3.QK_NORM + FFN,
    fused=FUSED,
    skipped=llama.skip_rotary_buffers,
)
