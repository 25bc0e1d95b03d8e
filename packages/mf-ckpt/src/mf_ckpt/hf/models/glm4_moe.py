"""GLM-4.5 (Glm4MoeForCausalLM) <-> mf names: Llama's attention (q/k/v biased when
`attention_bias`; per-head q/k RMSNorms when `use_qk_norm`), and DeepSeek-V3's feed-forward rules:
dense MLPs below `first_k_dense_replace`, then MoE layers of a sigmoid router with its
`e_score_correction_bias`, stacked routed experts and shared experts; its multi-token-prediction
layers are DeepSeek-V3's too (deepseek_v3.py: `mtp.{k}.`, the embedding and head copies)."""

from __future__ import annotations

from ..rules import Architecture, ConfigView
from . import deepseek_v3, llama, qwen3

DEFAULTS = {"tie_word_embeddings": False, "attention_bias": False, "use_qk_norm": False, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "num_nextn_predict_layers": 1, "moe_intermediate_size": 1408,
            "n_routed_experts": 128}

QK_NORM = tuple(r.__class__(r.mf, r.hf, r.shape, when=("qk_norm",)) for r in qwen3.QK_NORM)


def dims(c: ConfigView) -> dict[str, int]:
    moe_inter = c.int("moe_intermediate_size")
    hidden = c.int("hidden_size")
    return {**llama.dense_dims(c, default_head_dim=hidden // c.int("num_attention_heads")),
            "E": c.int("n_routed_experts"), "Im": moe_inter,
            "Is": moe_inter * (c.int("n_shared_experts", minimum=0) or 0), "H2": 2 * hidden}


def conditions(c: ConfigView) -> dict[str, bool]:
    tied = c.bool("tie_word_embeddings")
    return {"untied": not tied, "tied": tied, "attention_bias": c.bool("attention_bias"),
            "qk_norm": c.bool("use_qk_norm"), "shared": (c.int("n_shared_experts", minimum=0) or 0) > 0}


ARCH = Architecture(
    model_type="glm4_moe",
    hf_class="Glm4MoeForCausalLM",
    defaults=DEFAULTS,
    dims=dims,
    conditions=conditions,
    layer_conditions=deepseek_v3.layer_conditions,
    top=llama.TOP,
    layer=tuple(r for r in llama.ATTENTION if r.mf != "attention.wo.bias") + QK_NORM + deepseek_v3.FFN,
    fused=deepseek_v3.FUSED,
    skipped=llama.skip_rotary_buffers,
    mtp=deepseek_v3.MTP,
    mtp_layers=deepseek_v3.mtp_layers,
)
