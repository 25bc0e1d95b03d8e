"""Llama (LlamaForCausalLM) <-> mf names. Weights are [out, in]; RoPE stays in rotate_half order."""

from __future__ import annotations

from ..rules import Architecture, ConfigView, Rule

# transformers' LlamaConfig defaults for keys a config.json may omit.
DEFAULTS = {"tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}

TOP = (
    Rule("tok_embeddings.weight", "model.embed_tokens.weight", ("V", "H")),
    Rule("norm.weight", "model.norm.weight", ("H",)),
    Rule("output.weight", "lm_head.weight", ("V", "H"), when=("untied",)),
)

ATTENTION = (
    Rule("attention_norm.weight", "input_layernorm.weight", ("H",)),
    Rule("attention.wq.weight", "self_attn.q_proj.weight", ("Q", "H")),
    Rule("attention.wk.weight", "self_attn.k_proj.weight", ("KV", "H")),
    Rule("attention.wv.weight", "self_attn.v_proj.weight", ("KV", "H")),
    Rule("attention.wo.weight", "self_attn.o_proj.weight", ("H", "Q")),
    Rule("attention.wq.bias", "self_attn.q_proj.bias", ("Q",), when=("attention_bias",)),
    Rule("attention.wk.bias", "self_attn.k_proj.bias", ("KV",), when=("attention_bias",)),
    Rule("attention.wv.bias", "self_attn.v_proj.bias", ("KV",), when=("attention_bias",)),
    Rule("attention.wo.bias", "self_attn.o_proj.bias", ("H",), when=("attention_bias",)),
)

MLP = (
    Rule("ffn_norm.weight", "post_attention_layernorm.weight", ("H",)),
    Rule("feed_forward.w1.weight", "mlp.gate_proj.weight", ("I", "H")),
    Rule("feed_forward.w2.weight", "mlp.down_proj.weight", ("H", "I")),
    Rule("feed_forward.w3.weight", "mlp.up_proj.weight", ("I", "H")),
    Rule("feed_forward.w1.bias", "mlp.gate_proj.bias", ("I",), when=("mlp_bias",)),
    Rule("feed_forward.w2.bias", "mlp.down_proj.bias", ("H",), when=("mlp_bias",)),
    Rule("feed_forward.w3.bias", "mlp.up_proj.bias", ("I",), when=("mlp_bias",)),
)


def dense_dims(c: ConfigView, default_head_dim: int | None = None) -> dict[str, int]:
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    kv_heads = c.int("num_key_value_heads", heads)
    head_dim = c.int("head_dim", default_head_dim if default_head_dim is not None else hidden // heads)
    return {
        "V": c.int("vocab_size"),
        "H": hidden,
        "I": c.int("intermediate_size"),
        "Q": heads * head_dim,
        "KV": kv_heads * head_dim,
        "hd": head_dim,
    }


def skip_rotary_buffers(c: ConfigView):
    # Old checkpoints carry the derivable RoPE buffer `...rotary_emb.inv_freq`; nothing to convert.
    return lambda name: name.endswith(".rotary_emb.inv_freq")


ARCH = Architecture(
    model_type="llama",
    hf_class="LlamaForCausalLM",
    defaults=DEFAULTS,
    dims=dense_dims,
    conditions=lambda c: {
        "untied": not c.bool("tie_word_embeddings"),
        "attention_bias": c.bool("attention_bias"),
        "mlp_bias": c.bool("mlp_bias"),
    },
    layer_conditions=lambda c, i: {},
    top=TOP,
    layer=ATTENTION + MLP,
    skipped=skip_rotary_buffers,
)


