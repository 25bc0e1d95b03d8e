"""Tiny `model` sections of every registered architecture, for tests, demos and other packages'
tests (a few thousand parameters; build in milliseconds, compile in seconds)."""

from __future__ import annotations

from typing import Any

_COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
               max_position_embeddings=64, initializer_range=0.2)
_TINY: dict[str, dict[str, Any]] = {
    "llama": dict(model_type="llama", num_key_value_heads=2, **_COMMON),
    "qwen3": dict(model_type="qwen3", num_key_value_heads=2, head_dim=12, **_COMMON),
    "deepseek_v3": dict(model_type="deepseek_v3", num_key_value_heads=4, moe_intermediate_size=16,
                        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8,
                        qk_rope_head_dim=4, v_head_dim=8, **_COMMON),
    "qwen2": dict(model_type="qwen2", num_key_value_heads=2, **_COMMON),
    "mixtral": dict(model_type="mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                    **{**_COMMON, "intermediate_size": 16}),
    "qwen3_moe": dict(model_type="qwen3_moe", num_key_value_heads=2, head_dim=12, moe_intermediate_size=16,
                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[0], **_COMMON),
    # issue 30's models
    "gpt2": dict(model_type="gpt2", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **_COMMON),
    "glm": dict(model_type="glm", num_key_value_heads=2, head_dim=12, **_COMMON),
    "glm4": dict(model_type="glm4", num_key_value_heads=2, head_dim=12, **_COMMON),
    "qwen2_moe": dict(model_type="qwen2_moe", num_key_value_heads=2, moe_intermediate_size=16, num_experts=4,
                      num_experts_per_tok=2, shared_expert_intermediate_size=24, mlp_only_layers=[0], **_COMMON),
    "glm4_moe": dict(model_type="glm4_moe", num_key_value_heads=2, head_dim=12, moe_intermediate_size=16,
                     n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                     num_nextn_predict_layers=0, use_qk_norm=True, attention_bias=True, **_COMMON),
}


def tiny_model_section(model_type: str, **overrides: Any) -> dict[str, Any]:
    """A fresh tiny `model` mapping for `model_type`, with `overrides` applied."""
    if model_type not in _TINY:
        raise KeyError(f"no tiny preset for {model_type!r}; available: {', '.join(sorted(_TINY))}")
    return {**_TINY[model_type], **overrides}
