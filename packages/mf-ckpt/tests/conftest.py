"""Helpers for mf-ckpt tests: synthetic Hugging Face states described in HF's own module terms.

The builders below are written from transformers' module structure (LlamaAttention, LlamaMLP,
Qwen3Attention, Qwen2Attention, Mixtral/Qwen3Moe sparse blocks, DeepseekV3Attention/MoE), independently of mf_ckpt's rule tables, so a test that
round-trips them checks the tables rather than restating them.
"""

from __future__ import annotations

import numpy as np
import pytest


def _llama_like(cfg: dict, qk_norm: bool, mlp_bias_key: str | None) -> dict[str, tuple[int, ...]]:
    H, V, nH = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    nKV = cfg.get("num_key_value_heads") or nH
    hd = cfg.get("head_dim") or H // nH
    inter = cfg["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        for proj, out_dim in (("q", nH * hd), ("k", nKV * hd), ("v", nKV * hd)):
            shapes[p + f"self_attn.{proj}_proj.weight"] = (out_dim, H)
            if cfg.get("attention_bias"):
                shapes[p + f"self_attn.{proj}_proj.bias"] = (out_dim,)
        shapes[p + "self_attn.o_proj.weight"] = (H, nH * hd)
        if cfg.get("attention_bias"):
            shapes[p + "self_attn.o_proj.bias"] = (H,)
        if qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        for proj, shape in (("gate", (inter, H)), ("up", (inter, H)), ("down", (H, inter))):
            shapes[p + f"mlp.{proj}_proj.weight"] = shape
            if mlp_bias_key and cfg.get(mlp_bias_key):
                shapes[p + f"mlp.{proj}_proj.bias"] = (shape[0],)
    return shapes


def _deepseek(cfg: dict, fused: bool) -> dict[str, tuple[int, ...]]:
    H, V, nH = cfg["hidden_size"], cfg["vocab_size"], cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    E, Im, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["intermediate_size"]
    bias = cfg.get("attention_bias", False)
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, H)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        if qr is None:
            shapes[p + "self_attn.q_proj.weight"] = (nH * (nope + rope), H)
        else:
            shapes[p + "self_attn.q_a_proj.weight"] = (qr, H)
            if bias:
                shapes[p + "self_attn.q_a_proj.bias"] = (qr,)
            shapes[p + "self_attn.q_a_layernorm.weight"] = (qr,)
            shapes[p + "self_attn.q_b_proj.weight"] = (nH * (nope + rope), qr)
        shapes[p + "self_attn.kv_a_proj_with_mqa.weight"] = (kvr + rope, H)
        if bias:
            shapes[p + "self_attn.kv_a_proj_with_mqa.bias"] = (kvr + rope,)
        shapes[p + "self_attn.kv_a_layernorm.weight"] = (kvr,)
        shapes[p + "self_attn.kv_b_proj.weight"] = (nH * (nope + v), kvr)
        shapes[p + "self_attn.o_proj.weight"] = (H, nH * v)
        if bias:
            shapes[p + "self_attn.o_proj.bias"] = (H,)
        if i < cfg["first_k_dense_replace"]:
            shapes[p + "mlp.gate_proj.weight"] = (inter, H)
            shapes[p + "mlp.up_proj.weight"] = (inter, H)
            shapes[p + "mlp.down_proj.weight"] = (H, inter)
            continue
        shapes[p + "mlp.gate.weight"] = (E, H)
        shapes[p + "mlp.gate.e_score_correction_bias"] = (E,)
        if fused:
            shapes[p + "mlp.experts.gate_up_proj"] = (E, 2 * Im, H)
            shapes[p + "mlp.experts.down_proj"] = (E, H, Im)
        else:
            for e in range(E):
                shapes[p + f"mlp.experts.{e}.gate_proj.weight"] = (Im, H)
                shapes[p + f"mlp.experts.{e}.up_proj.weight"] = (Im, H)
                shapes[p + f"mlp.experts.{e}.down_proj.weight"] = (H, Im)
        n_shared = cfg.get("n_shared_experts") or 0
        if n_shared:
            shapes[p + "mlp.shared_experts.gate_proj.weight"] = (Im * n_shared, H)
            shapes[p + "mlp.shared_experts.up_proj.weight"] = (Im * n_shared, H)
            shapes[p + "mlp.shared_experts.down_proj.weight"] = (H, Im * n_shared)
    return shapes


def _qwen2(cfg: dict) -> dict[str, tuple[int, ...]]:
    # Qwen2Attention: q/k/v always biased, o_proj never; Qwen2MLP unbiased.
    shapes = _llama_like(dict(cfg, attention_bias=False), qk_norm=False, mlp_bias_key=None)
    for name, shape in list(shapes.items()):
        if any(f"self_attn.{p}_proj.weight" in name for p in "qkv"):
            shapes[name.replace(".weight", ".bias")] = (shape[0],)
    return shapes


def _sparse_moe(cfg: dict, fused: bool) -> dict[str, tuple[int, ...]]:
    """MixtralSparseMoeBlock (block_sparse_moe.experts.{e}.w1/w2/w3) in every layer, or
    Qwen3MoeSparseMoeBlock (mlp.gate, mlp.experts.{e}.gate/up/down_proj) where HF's layer rule
    says so, a Qwen3MoeMLP elsewhere."""
    mixtral = cfg["model_type"] == "mixtral"
    base = _llama_like(cfg, qk_norm=not mixtral, mlp_bias_key=None)
    shapes = {k: v for k, v in base.items() if ".mlp." not in k}
    H = cfg["hidden_size"]
    E = cfg["num_local_experts"] if mixtral else cfg["num_experts"]
    inner = cfg["intermediate_size"] if mixtral else cfg["moe_intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if mixtral:
            shapes[p + "block_sparse_moe.gate.weight"] = (E, H)
            for e in range(E):
                for w, shape in (("w1", (inner, H)), ("w3", (inner, H)), ("w2", (H, inner))):
                    shapes[p + f"block_sparse_moe.experts.{e}.{w}.weight"] = shape
            continue
        if i in cfg.get("mlp_only_layers", []) or (i + 1) % cfg.get("decoder_sparse_step", 1):
            shapes.update({k: v for k, v in base.items() if k.startswith(p + "mlp.")})
            continue
        shapes[p + "mlp.gate.weight"] = (E, H)
        if fused:
            shapes[p + "mlp.experts.gate_up_proj"] = (E, 2 * inner, H)
            shapes[p + "mlp.experts.down_proj"] = (E, H, inner)
            continue
        for e in range(E):
            for w, shape in (("gate_proj", (inner, H)), ("up_proj", (inner, H)), ("down_proj", (H, inner))):
                shapes[p + f"mlp.experts.{e}.{w}.weight"] = shape
    return shapes


def hf_shapes(cfg: dict, fused: bool = False) -> dict[str, tuple[int, ...]]:
    if cfg["model_type"] == "llama":
        return _llama_like(cfg, qk_norm=False, mlp_bias_key="mlp_bias")
    if cfg["model_type"] == "qwen3":
        return _llama_like(cfg, qk_norm=True, mlp_bias_key=None)
    if cfg["model_type"] == "qwen2":
        return _qwen2(cfg)
    if cfg["model_type"] in ("mixtral", "qwen3_moe"):
        return _sparse_moe(cfg, fused)
    if cfg["model_type"] == "deepseek_v3":
        return _deepseek(cfg, fused)
    raise ValueError(cfg["model_type"])


def random_state(shapes: dict[str, tuple[int, ...]], seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(dtype) for k, s in shapes.items()}


SMALL = {
    "llama": dict(model_type="llama", hidden_size=32, vocab_size=50, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=False,
                  attention_bias=True, mlp_bias=True),
    "qwen3": dict(model_type="qwen3", hidden_size=32, vocab_size=50, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=12, intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=True,
                  attention_bias=True),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=32, vocab_size=50, num_attention_heads=4,
                        num_key_value_heads=4, intermediate_size=48, num_hidden_layers=4, first_k_dense_replace=2,
                        q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                        n_routed_experts=4, moe_intermediate_size=8, n_shared_experts=2, tie_word_embeddings=False,
                        attention_bias=True),
    "qwen2": dict(model_type="qwen2", hidden_size=32, vocab_size=50, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=48, num_hidden_layers=2, tie_word_embeddings=False),
    "mixtral": dict(model_type="mixtral", hidden_size=32, vocab_size=50, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=24, num_hidden_layers=3, num_local_experts=3, tie_word_embeddings=True),
    "qwen3_moe": dict(model_type="qwen3_moe", hidden_size=32, vocab_size=50, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=12, intermediate_size=48, moe_intermediate_size=8,
                      num_experts=4, num_hidden_layers=3, mlp_only_layers=[1], decoder_sparse_step=1,
                      tie_word_embeddings=False, attention_bias=False),
}


class Builders:
    hf_shapes = staticmethod(hf_shapes)
    random_state = staticmethod(random_state)
    small = SMALL


@pytest.fixture
def hf_builders() -> type[Builders]:
    return Builders
