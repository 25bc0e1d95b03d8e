"""Helpers for mf-ckpt tests: synthetic Hugging Face states described in HF's own module terms.

The builders below are written from transformers' module structure (LlamaAttention, LlamaMLP,
Qwen3Attention, Qwen2Attention, Mixtral/Qwen3Moe sparse blocks, DeepseekV3Attention/MoE, GPT2Block's
Conv1D layers, Glm4DecoderLayer, Qwen2MoeSparseMoeBlock, Glm4MoeDecoderLayer, transformers' MtpLayer
as DeepSeek's checkpoints store it), independently of mf_ckpt's rule tables, so a test that
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


def _gpt2(cfg: dict) -> dict[str, tuple[int, ...]]:
    """GPT2LMHeadModel: Conv1D weights are [in, out]; c_attn holds q, k, v side by side."""
    H, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    inner = cfg.get("n_inner") or 4 * H
    shapes = {"transformer.wte.weight": (V, H), "transformer.wpe.weight": (P, H),
              "transformer.ln_f.weight": (H,), "transformer.ln_f.bias": (H,)}
    if not cfg.get("tie_word_embeddings", True):
        shapes["lm_head.weight"] = (V, H)
    for i in range(L):
        p = f"transformer.h.{i}."
        for ln in ("ln_1", "ln_2"):
            shapes[p + ln + ".weight"] = shapes[p + ln + ".bias"] = (H,)
        shapes.update({p + "attn.c_attn.weight": (H, 3 * H), p + "attn.c_attn.bias": (3 * H,),
                       p + "attn.c_proj.weight": (H, H), p + "attn.c_proj.bias": (H,),
                       p + "mlp.c_fc.weight": (H, inner), p + "mlp.c_fc.bias": (inner,),
                       p + "mlp.c_proj.weight": (inner, H), p + "mlp.c_proj.bias": (H,)})
    return shapes


def _glm4(cfg: dict) -> dict[str, tuple[int, ...]]:
    """Glm4DecoderLayer: four norms, o_proj never biased, MLP gate and up in one gate_up_proj."""
    base = _llama_like(cfg, qk_norm=False, mlp_bias_key=None)
    H, inter = cfg["hidden_size"], cfg["intermediate_size"]
    shapes = {k: v for k, v in base.items() if not k.endswith(("o_proj.bias", "gate_proj.weight", "up_proj.weight"))}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "mlp.gate_up_proj.weight": (2 * inter, H), p + "post_self_attn_layernorm.weight": (H,),
                       p + "post_mlp_layernorm.weight": (H,)})
    return shapes


def _glm(cfg: dict) -> dict[str, tuple[int, ...]]:
    """GlmDecoderLayer: Glm4's without the post-attention / post-MLP norms."""
    return {k: v for k, v in _glm4(cfg).items() if "post_self_attn" not in k and "post_mlp" not in k}


def _qwen2_moe(cfg: dict, fused: bool) -> dict[str, tuple[int, ...]]:
    """Qwen2MoeSparseMoeBlock: Qwen3-MoE's layers without q/k norms, q/k/v biases (qkv_bias), and a
    shared expert with its sigmoid gate in each MoE layer."""
    shapes = _sparse_moe(dict(cfg, model_type="qwen3_moe"), fused)
    shapes = {k: v for k, v in shapes.items() if "_norm.weight" not in k or "layernorm" in k}
    H, Is = cfg["hidden_size"], cfg["shared_expert_intermediate_size"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        if cfg.get("qkv_bias", True):
            for proj in "qkv":
                shapes[p + f"self_attn.{proj}_proj.bias"] = (shapes[p + f"self_attn.{proj}_proj.weight"][0],)
        if p + "mlp.gate.weight" in shapes:
            shapes.update({p + "mlp.shared_expert.gate_proj.weight": (Is, H), p + "mlp.shared_expert.up_proj.weight": (Is, H),
                           p + "mlp.shared_expert.down_proj.weight": (H, Is), p + "mlp.shared_expert_gate.weight": (1, H)})
    return shapes


def _glm4_moe(cfg: dict, fused: bool) -> dict[str, tuple[int, ...]]:
    """Glm4MoeDecoderLayer: Llama's attention (biases on q/k/v only, optional q/k norms) and
    DeepSeek-V3's MLP / MoE layers."""
    ds = _deepseek(dict(cfg, q_lora_rank=None, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0, kv_lora_rank=0,
                        attention_bias=False), fused)
    attn = _llama_like(dict(cfg, intermediate_size=1), qk_norm=cfg.get("use_qk_norm", False), mlp_bias_key=None)
    shapes = {k: v for k, v in ds.items() if ".self_attn." not in k}
    shapes.update({k: v for k, v in attn.items() if ".self_attn." in k and not k.endswith("o_proj.bias")})
    return shapes


def mtp_layer(cfg: dict, shapes: dict[str, tuple[int, ...]], copies: bool = True) -> dict[str, tuple[int, ...]]:
    """The checkpoint's MTP layer `model.layers.{num_hidden_layers}` as DeepSeek stores it: the
    last (MoE) decoder layer's tensors, enorm, hnorm, eh_proj [H, 2H], shared_head.norm and (with
    `copies`) its own embed_tokens and shared_head.head."""
    n, H, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    last, p = f"model.layers.{n - 1}.", f"model.layers.{n}."
    out = {p + k[len(last):]: v for k, v in shapes.items() if k.startswith(last)}
    out.update({p + "enorm.weight": (H,), p + "hnorm.weight": (H,), p + "eh_proj.weight": (H, 2 * H),
                p + "shared_head.norm.weight": (H,)})
    if copies:
        out.update({p + "embed_tokens.weight": (V, H), p + "shared_head.head.weight": (V, H)})
    return out


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
    if cfg["model_type"] == "gpt2":
        return _gpt2(cfg)
    if cfg["model_type"] == "glm4":
        return _glm4(cfg)
    if cfg["model_type"] == "glm":
        return _glm(cfg)
    if cfg["model_type"] == "qwen2_moe":
        return _qwen2_moe(cfg, fused)
    if cfg["model_type"] == "glm4_moe":
        return _glm4_moe(cfg, fused)
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
    "gpt2": dict(model_type="gpt2", n_embd=32, vocab_size=50, n_head=4, n_layer=3, n_positions=40, n_inner=40,
                 tie_word_embeddings=True),
    "glm4": dict(model_type="glm4", hidden_size=32, vocab_size=50, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=12, intermediate_size=48, num_hidden_layers=3, tie_word_embeddings=False,
                 attention_bias=True),
    "glm": dict(model_type="glm", hidden_size=32, vocab_size=50, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, intermediate_size=40, num_hidden_layers=2, tie_word_embeddings=True, attention_bias=True),
    "qwen2_moe": dict(model_type="qwen2_moe", hidden_size=32, vocab_size=50, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=48, moe_intermediate_size=8, num_experts=4,
                      shared_expert_intermediate_size=24, num_hidden_layers=4, mlp_only_layers=[2],
                      decoder_sparse_step=1, tie_word_embeddings=True, qkv_bias=True),
    "glm4_moe": dict(model_type="glm4_moe", hidden_size=32, vocab_size=50, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=12, intermediate_size=48, num_hidden_layers=3,
                     first_k_dense_replace=1, n_routed_experts=4, moe_intermediate_size=8, n_shared_experts=1,
                     use_qk_norm=True, attention_bias=True, tie_word_embeddings=False,
                     num_nextn_predict_layers=1),
}


class Builders:
    hf_shapes = staticmethod(hf_shapes)
    mtp_layer = staticmethod(mtp_layer)
    random_state = staticmethod(random_state)
    small = SMALL


@pytest.fixture
def hf_builders() -> type[Builders]:
    return Builders


# ---- tokenizers a checkpoint can carry ----------------------------------------------------------
def _corpus_lines() -> list[str]:
    from pydoc_data.topics import topics  # real English text that ships with Python

    return [line for text in list(topics.values())[:60] for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="session")
def spm_files(tmp_path_factory) -> dict[str, bytes]:
    """A 300-piece sentencepiece model with the tokenizer_config.json mf-data writes beside one
    (special tokens, no BOS/EOS added): what a checkpoint of a sentencepiece run carries."""
    import io
    import json

    spm = pytest.importorskip("sentencepiece", reason="sentencepiece (mf-ckpt's test extra) makes the test tokenizer")
    model = io.BytesIO()
    spm.SentencePieceTrainer.Train(sentence_iterator=iter(_corpus_lines()), model_writer=model, vocab_size=300,
                                   minloglevel=2)
    config = {"tokenizer_class": "TokenizersBackend", "add_bos_token": False, "add_eos_token": False,
              "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False}
    return {"tokenizer.model": model.getvalue(), "tokenizer_config.json": json.dumps(config).encode()}


@pytest.fixture(scope="session")
def hf_tokenizer_files(tmp_path_factory) -> dict[str, bytes]:
    """A byte-level BPE tokenizer.json (tokenizers) with its tokenizer_config.json and a chat template."""
    import json

    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers (mf-ckpt's test extra) makes the test tokenizer")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus_lines(), trainer)
    config = {"tokenizer_class": "TokenizersBackend", "eos_token": "<|endoftext|>", "model_max_length": 1024}
    return {"tokenizer.json": tok.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode(),
            "chat_template.jinja": b"{% for m in messages %}{{ m['content'] }}{% endfor %}"}
