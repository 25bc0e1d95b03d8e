"""Qwen2-MoE (Qwen2MoeForCausalLM) <-> mf names: Qwen2's attention (q/k/v biased when `qkv_bias`,
transformers' default), and in MoE layers Qwen3-MoE's router and stacked experts plus one shared
expert (`mlp.shared_expert.*` -> `moe.shared_experts.w1/w2/w3`) scaled by a sigmoid gate
(`mlp.shared_expert_gate.weight` [1, H] -> `moe.shared_expert_gate.weight`). Layer i is MoE when
i is not in `mlp_only_layers`, num_experts > 0 and (i + 1) % decoder_sparse_step == 0 (HF's rule);
the others have a dense MLP of `intermediate_size`."""

from __future__ import annotations

from ..rules import Architecture, ConfigView, Rule
from . import llama, qwen3_moe

DEFAULTS = {"tie_word_embeddings": False, "qkv_bias": True, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_experts": 60}

ATTENTION = tuple(r for r in llama.ATTENTION if "attention_bias" not in r.when) + tuple(
    Rule(f"attention.{w}.bias", f"self_attn.{p}_proj.bias", (d,), when=("qkv_bias",))
    for w, p, d in (("wq", "q", "Q"), ("wk", "k", "KV"), ("wv", "v", "KV")))

SHARED = (
    Rule("moe.shared_experts.w1.weight", "mlp.shared_expert.gate_proj.weight", ("Is", "H"), when=("moe", "shared")),
    Rule("moe.shared_experts.w2.weight", "mlp.shared_expert.down_proj.weight", ("H", "Is"), when=("moe", "shared")),
    Rule("moe.shared_experts.w3.weight", "mlp.shared_expert.up_proj.weight", ("Is", "H"), when=("moe", "shared")),
    Rule("moe.shared_expert_gate.weight", "mlp.shared_expert_gate.weight", ("one", "H"), when=("moe", "shared")),
)


def dims(c: ConfigView) -> dict[str, int]:
    return {**qwen3_moe.dims(c), "Is": c.int("shared_expert_intermediate_size", minimum=0), "one": 1}


ARCH = Architecture(
    model_type="qwen2_moe",
    hf_class="Qwen2MoeForCausalLM",
    defaults=DEFAULTS,
    dims=dims,
    conditions=lambda c: {"untied": not c.bool("tie_word_embeddings"), "qkv_bias": c.bool("qkv_bias"),
                          "shared": c.int("shared_expert_intermediate_size", minimum=0) > 0},
    layer_conditions=qwen3_moe.layer_conditions,
    top=llama.TOP,
    layer=ATTENTION + qwen3_moe.FFN + SHARED,
    fused=qwen3_moe.FUSED,
    skipped=llama.skip_rotary_buffers,
)
