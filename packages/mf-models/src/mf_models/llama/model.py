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
        dim, hd, qkv_bias, o_bias = args.hidden_size, args.head_dim, args.qkv_bias, args.o_bias
        self.layer_id = layer_id
        self.head_dim = hd
        self.wq = Linear(dim, args.num_attention_heads * hd, qkv_bias, params_dtype, compute_dtype)
        self.wk = Linear(dim, args.num_key_value_heads * hd, qkv_bias, params_dtype, compute_dtype)
        self.wv = Linear(dim, args.num_key_value_heads * hd, qkv_bias, params_dtype, compute_dtype)
        self.wo = Linear(args.num_attention_heads * hd, dim, o_bias, params_dtype, compute_dtype)
        self.core = CoreAttention(self.scale(args, layer_id), args.use_flash_attention, compute_dtype)

    def scale(self, args, layer_id: int) -> float:
        """The softmax scale (hook: GPT-2 can drop it or divide it by the layer number)."""
        return self.head_dim ** -0.5

    def norm_qk(self, q, k):
        """Hook for per-head q/k normalisation (Qwen3); Llama has none."""
        return q, k

    def rotate(self, x, cos, sin):
        """Hook for the rotary embedding of q or k [B, heads, S, hd]: whole heads, rotate_half
        (GLM-4 rotates part of each head; GPT-2 has none)."""
        return apply_rotary(x, cos, sin)

    def construct(self, x, cos, sin, mask, cache=None):
        q = self.wq(x)
        b, s = q.shape[0], q.shape[1]      # from the projection: a plan may feed it a sequence shard
        q = q.reshape(b, s, -1, self.head_dim)
        k = self.wk(x).reshape(b, s, -1, self.head_dim)
        v = self.wv(x).reshape(b, s, -1, self.head_dim)
        q, k = self.norm_qk(q, k)
        q = self.rotate(q.transpose(0, 2, 1, 3), cos, sin)  # [B, heads, S, hd]
        k = self.rotate(k.transpose(0, 2, 1, 3), cos, sin)
        v = v.transpose(0, 2, 1, 3)
        if cache is not None:
            k, v = cache.update(self.layer_id, k, v)
        out = self.core(q, k, v, mask)
        return self.wo(out.transpose(0, 2, 1, 3).reshape(b, s, -1))


class TransformerBlock(nn.Cell):
    """Pre-norm block: attention, then a SwiGLU `feed_forward` or, when `moe` is given (Mixtral,
    Qwen3-MoE, DeepSeek-V3's MoE layers), that MoE layer, whose routing statistics are returned
    after the hidden states. `attention_cls(args, layer_id, compute_dtype, params_dtype)` builds the
    attention (Llama's, Qwen3's, DeepSeek-V3's MLA); `mlp_bias` None: the args' `mlp_bias`.
    `norm(dim)` makes the two norms (RMSNorm by default; GPT-2: LayerNorm) and `feed_forward` is
    the dense MLP when not SwiGLU (GPT-2's GELU MLP)."""

    def __init__(self, args: LlamaArgs, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type,
                 attention_cls: type[nn.Cell] = Attention, moe: nn.Cell | None = None, mlp_bias: bool | None = None,
                 norm=None, feed_forward: nn.Cell | None = None):
        super().__init__()
        norm = norm or (lambda dim: RMSNorm(dim, args.rms_norm_eps, params_dtype))
        self.attention_norm = norm(args.hidden_size)
        self.attention = attention_cls(args, layer_id, compute_dtype, params_dtype)
        self.ffn_norm = norm(args.hidden_size)
        self.moe_enabled = moe is not None
        if self.moe_enabled:
            self.moe = moe
        elif feed_forward is not None:
            self.feed_forward = feed_forward
        else:
            self.feed_forward = FeedForward(args.hidden_size, args.intermediate_size,
                                            args.mlp_bias if mlp_bias is None else mlp_bias, params_dtype,
                                            compute_dtype)

    def construct(self, x, cos, sin, mask, cache=None):
        h = x + self.attention(self.attention_norm(x), cos, sin, mask, cache)
        if self.moe_enabled:
            out, load, counts, aux_counts, aux_sums = self.moe(self.ffn_norm(h))
            return h + out, load, counts, aux_counts, aux_sums
        return h + self.feed_forward(self.ffn_norm(h))


class GQACausalLM(CausalLM):
    """Accounting shared by the models built on Llama's attention (llama, qwen2, qwen3, mixtral,
    qwen3_moe): q, k and v heads of `head_dim`, `num_key_value_heads` cached."""

    def attention_flops_dims(self) -> tuple[int, int, int]:
        return self.args.num_attention_heads, self.args.head_dim, self.args.head_dim

    def kv_cache_shapes(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.args.num_key_value_heads, self.args.head_dim), (self.args.num_key_value_heads, self.args.head_dim)


class LlamaForCausalLM(GQACausalLM):
    def __init__(self, args: LlamaArgs):
        super().__init__(args, args.head_dim,
                         lambda i, cdt, pdt: TransformerBlock(args, i, cdt, pdt))
