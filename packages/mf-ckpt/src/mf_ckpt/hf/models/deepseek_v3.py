"""DeepSeek-V3 (MLA + MoE) <-> mf names. Layers i < first_k_dense_replace have a dense MLP.

Routed experts are one HF tensor per expert (`mlp.experts.{e}.gate_proj.weight`) and one stacked
mf tensor `moe.experts.w1` [E, I_moe, H]; transformers-5 fused tensors (`mlp.experts.gate_up_proj`
[E, 2*I_moe, H], `mlp.experts.down_proj` [E, H, I_moe]) are read too. The multi-token-prediction
layers (`model.layers.{num_hidden_layers + k}`) have no mf counterpart, as in transformers, and
are skipped with a warning.
"""

from __future__ import annotations

from ...errors import CheckpointError
from ..rules import Architecture, ConfigView, Rule, layer_prefix_matcher
from . import llama, qwen3_moe

# transformers' DeepseekV3Config defaults for keys a config.json may omit.
DEFAULTS = {
    "tie_word_embeddings": False,
    "attention_bias": False,
    "q_lora_rank": 1536,
    "n_shared_experts": 1,
    "num_nextn_predict_layers": 0,
}

ATTENTION = (
    Rule("attention_norm.weight", "input_layernorm.weight", ("H",)),
    Rule("attention.wq.weight", "self_attn.q_proj.weight", ("Qh", "H"), when=("no_q_lora",)),
    Rule("attention.wq_a.weight", "self_attn.q_a_proj.weight", ("qr", "H"), when=("q_lora",)),
    Rule("attention.wq_a.bias", "self_attn.q_a_proj.bias", ("qr",), when=("q_lora", "attention_bias")),
    Rule("attention.q_norm.weight", "self_attn.q_a_layernorm.weight", ("qr",), when=("q_lora",)),
    Rule("attention.wq_b.weight", "self_attn.q_b_proj.weight", ("Qh", "qr"), when=("q_lora",)),
    Rule("attention.wkv_a.weight", "self_attn.kv_a_proj_with_mqa.weight", ("KVa", "H")),
    Rule("attention.wkv_a.bias", "self_attn.kv_a_proj_with_mqa.bias", ("KVa",), when=("attention_bias",)),
    Rule("attention.kv_norm.weight", "self_attn.kv_a_layernorm.weight", ("kvr",)),
    Rule("attention.wkv_b.weight", "self_attn.kv_b_proj.weight", ("KVb", "kvr")),
    Rule("attention.wo.weight", "self_attn.o_proj.weight", ("H", "O")),
    Rule("attention.wo.bias", "self_attn.o_proj.bias", ("H",), when=("attention_bias",)),
)

# Qwen3-MoE's layout (norm, dense MLP below first_k_dense_replace, router, stacked experts) plus the
# router's correction bias and the shared experts; the same fused transformers-5 tensors.
FFN = qwen3_moe.FFN[:5] + (
    Rule("moe.router.expert_bias", "mlp.gate.e_score_correction_bias", ("E",), when=("moe",)),
) + qwen3_moe.FFN[5:] + (
    Rule("moe.shared_experts.w1.weight", "mlp.shared_experts.gate_proj.weight", ("Is", "H"), when=("moe", "shared")),
    Rule("moe.shared_experts.w2.weight", "mlp.shared_experts.down_proj.weight", ("H", "Is"), when=("moe", "shared")),
    Rule("moe.shared_experts.w3.weight", "mlp.shared_experts.up_proj.weight", ("Is", "H"), when=("moe", "shared")),
)

FUSED = qwen3_moe.FUSED


def dims(c: ConfigView) -> dict[str, int]:
    heads = c.int("num_attention_heads")
    nope, rope, v = c.int("qk_nope_head_dim"), c.int("qk_rope_head_dim"), c.int("v_head_dim")
    kv_rank = c.int("kv_lora_rank")
    moe_inter = c.int("moe_intermediate_size")
    return {
        "V": c.int("vocab_size"),
        "H": c.int("hidden_size"),
        "I": c.int("intermediate_size"),
        "Qh": heads * (nope + rope),
        "qr": c.int("q_lora_rank", nullable=True) or 0,
        "KVa": kv_rank + rope,
        "kvr": kv_rank,
        "KVb": heads * (nope + v),
        "O": heads * v,
        "E": c.int("n_routed_experts"),
        "Im": moe_inter,
        "Is": moe_inter * (c.int("n_shared_experts", minimum=0) or 0),
    }


def conditions(c: ConfigView) -> dict[str, bool]:
    quant = c.raw.get("quantization_config")
    if quant is not None:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise CheckpointError(f"config.json (deepseek_v3): quantization_config ({method!r}: block-scaled weights with "
                              f"weight_scale_inv tensors) is not supported; dequantize the checkpoint to BF16 first "
                              f"(e.g. DeepSeek's fp8_cast_bf16.py) and remove the key")
    freq = c.raw.get("moe_layer_freq", 1)
    if freq != 1:
        # transformers' DeepseekV3 makes every layer from first_k_dense_replace on MoE.
        raise CheckpointError(f"config.json (deepseek_v3): moe_layer_freq={freq!r} is not supported (only 1)")
    q_lora = c.int("q_lora_rank", nullable=True) is not None
    return {
        "untied": not c.bool("tie_word_embeddings"),
        "attention_bias": c.bool("attention_bias"),
        "q_lora": q_lora,
        "no_q_lora": not q_lora,
        "shared": (c.int("n_shared_experts", minimum=0) or 0) > 0,
    }


def layer_conditions(c: ConfigView, i: int) -> dict[str, bool]:
    moe = i >= c.int("first_k_dense_replace", minimum=0)
    return {"moe": moe, "dense": not moe}


def skipped(c: ConfigView):
    mtp = layer_prefix_matcher(c.int("num_hidden_layers"), c.int("num_nextn_predict_layers", minimum=0))
    rotary = llama.skip_rotary_buffers(c)
    return lambda name: mtp(name) or rotary(name)


ARCH = Architecture(
    model_type="deepseek_v3",
    hf_class="DeepseekV3ForCausalLM",
    defaults=DEFAULTS,
    dims=dims,
    conditions=conditions,
    layer_conditions=layer_conditions,
    top=llama.TOP,
    layer=ATTENTION + FFN,
    fused=FUSED,
    skipped=skipped,
)
