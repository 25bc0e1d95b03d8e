"""Llama: pre-norm decoder blocks of GQA attention (RoPE) and a SwiGLU feed-forward.

Parameter names follow the mf contract (tok_embeddings, layers.{i}.attention.wq, ...). No parallel
code here: a tensor-parallel plan replaces `attention.wq/wk/wv` (column, by heads),
`attention.wo` (row), `feed_forward.w1/w3` (column), `feed_forward.w2` (row), `tok_embeddings`
and `output`. The head count is read from the tensors (reshape with -1), so sharded projections
need no change to this file.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn

from ..common.attention import CoreAttention
from ..common.layers import FeedForward, Linear, RMSNorm
from ..common.rope import apply_rotary
from ..common.transformer import CausalLM
from .args import LlamaArgs


class Attention(nn.Cell):
    def __init__(self, args: LlamaArgs, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type):
        super().__init__()
        dim, hd, bias = args.hidden_size, args.head_dim, args.attention_bias
        self.layer_id = layer_id
        self.head_dim = hd
        self.wq = Linear(dim, args.num_attention_heads * hd, bias, params_dtype, compute_dtype)
        self.wk = Linear(dim, args.num_key_value_heads * hd, bias, params_dtype, compute_dtype)
        self.wv = Linear(dim, args.num_key_value_heads * hd, bias, params_dtype, compute_dtype)
        self.wo = Linear(args.num_attention_heads * hd, dim, bias, params_dtype, compute_dtype)
        self.core = CoreAttention(hd ** -0.5, args.use_flash_attention, compute_dtype)

    def norm_qk(self, q, k):
        """Hook for per-head q/k normalisation (Qwen3); Llama has none."""
        return q, k

    def construct(self, x, cos, sin, mask, cache=None):
        b, s, _ = x.shape
        q = self.wq(x).reshape(b, s, -1, self.head_dim)
        k = self.wk(x).reshape(b, s, -1, self.head_dim)
        v = self.wv(x).reshape(b, s, -1, self.head_dim)
        q, k = self.norm_qk(q, k)
        q = apply_rotary(q.transpose(0, 2, 1, 3), cos, sin)  # [B, heads, S, hd]
        k = apply_rotary(k.transpose(0, 2, 1, 3), cos, sin)
        v = v.transpose(0, 2, 1, 3)
        if cache is not None:
            k, v = cache.update(self.layer_id, k, v)
        out = self.core(q, k, v, mask)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(b, s, -1))


class TransformerBlock(nn.Cell):
    def __init__(self, args: LlamaArgs, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type,
                 attention_cls: type[Attention] = Attention):
        super().__init__()
        self.attention_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, params_dtype)
        self.attention = attention_cls(args, layer_id, compute_dtype, params_dtype)
        self.ffn_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, params_dtype)
        self.feed_forward = FeedForward(args.hidden_size, args.intermediate_size, args.mlp_bias,
                                        params_dtype, compute_dtype)

    def construct(self, x, cos, sin, mask, cache=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, cache)
        return h + self.feed_forward(self.ffn_norm(h))


class LlamaForCausalLM(CausalLM):
    def __init__(self, args: LlamaArgs):
        super().__init__(args, args.head_dim,
                         lambda i, cdt, pdt: TransformerBlock(args, i, cdt, pdt))

    def attention_flops_dims(self) -> tuple[int, int, int]:
        return self.args.num_attention_heads, self.args.head_dim, self.args.head_dim

    def kv_cache_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.args.num_key_value_heads, self.args.head_dim), (self.args.num_key_value_heads, self.args.head_dim)
