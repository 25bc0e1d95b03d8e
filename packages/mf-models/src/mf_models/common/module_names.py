"""The names of a decoder layer's modules as other stacks write them.

mf's decoder layers hold `attention_norm`, `attention` (wq, wk, wv, wo, or MLA's projections),
`ffn_norm` and `feed_forward` (w1, w2, w3, or the MoE block: router, experts, shared experts) -
Meta's llama names. The YAML fields that name modules inside a layer (`recompute.select_module`,
`swap.op_swap[].op_name`) also take MindFormers' (Megatron-Core's) and Hugging Face's names for
them, so the reference's own examples (`"attention"`, `"mlp"`) select what they say.
"""

from __future__ import annotations

# first path component as MindFormers / Megatron-Core / transformers write it -> mf's module
LAYER_MODULE_ALIASES = {
    "mlp": "feed_forward",                      # MindFormers, Megatron-Core, transformers
    "self_attention": "attention",              # MindFormers, Megatron-Core
    "self_attn": "attention",                   # transformers
    "input_layernorm": "attention_norm",        # Megatron-Core, transformers
    "pre_mlp_layernorm": "ffn_norm",            # Megatron-Core
    "post_attention_layernorm": "ffn_norm",     # transformers (the norm before the MLP)
}


def layer_module_path(path: str) -> str:
    """`path` inside a decoder layer with its first component in mf's names: `mlp` ->
    `feed_forward`, `self_attention.wq` -> `attention.wq`; mf's own names unchanged."""
    first, dot, rest = path.partition(".")
    return LAYER_MODULE_ALIASES.get(first, first) + dot + rest
