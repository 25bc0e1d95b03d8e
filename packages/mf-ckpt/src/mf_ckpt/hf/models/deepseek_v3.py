"""DeepSeek-V3 (MLA + MoE) <-> mf names. Layers i < first_k_dense_replace have a dense MLP.

Routed experts are one HF tensor per expert (`mlp.experts.{e}.gate_proj.weight`) and one stacked
mf tensor `moe.experts.w1` [E, I_moe, H]; transformers-5 fused tensors (`mlp.experts.gate_up_proj`
[E, 2*I_moe, H], `mlp.experts.down_proj` [E, H, I_moe]) are read too.

The multi-token-prediction layers (`model.layers.{num_hidden_layers + k}`, k <
`num_nextn_predict_layers`) are mf's `mtp.{k}.`: `enorm`, `hnorm`, `eh_proj` [H, 2H] and
`shared_head.norm` (mf `norm`) of their own, and a decoder block (`mtp.{k}.block.`: the layer
rules, MoE as the last layers are). DeepSeek's checkpoints repeat the embedding and the output head
in each (`embed_tokens`, `shared_head.head`): mf shares the main model's, so those are never read
and are written back as copies. A checkpoint without the MTP layers (transformers saves none)
plans the causal LM alone.
"""

from __future__ import annotations

from ...errors import CheckpointError
from ..rules import Architecture, ConfigView, Rule
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
        "H2": 2 * c.int("hidden_size"),
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
        "tied": c.bool("tie_word_embeddings"),
        "attention_bias": c.bool("attention_bias"),
        "q_lora": q_lora,
        "no_q_lora": not q_lora,
        "shared": (c.int("n_shared_experts", minimum=0) or 0) > 0,
    }


def layer_conditions(c: ConfigView, i: int) -> dict[str, bool]:
    moe = i >= c.int("first_k_dense_replace", minimum=0)
    return {"moe": moe, "dense": not moe}


MTP = (
    Rule("enorm.weight", "enorm.weight", ("H",)),
    Rule("hnorm.weight", "hnorm.weight", ("H",)),
    Rule("eh_proj.weight", "eh_proj.weight", ("H", "H2")),
    Rule("norm.weight", "shared_head.norm.weight", ("H",)),
    Rule("", "embed_tokens.weight", ("V", "H"), copy_of="tok_embeddings.weight"),
    Rule("", "shared_head.head.weight", ("V", "H"), when=("untied",), copy_of="output.weight"),
    Rule("", "shared_head.head.weight", ("V", "H"), when=("tied",), copy_of="tok_embeddings.weight"),
)


def mtp_layers(c: ConfigView) -> int:
    return c.int("num_nextn_predict_layers", minimum=0)


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
    skipped=llama.skip_rotary_buffers,
    mtp=MTP,
    mtp_layers=mtp_layers,
)
