"""Qwen3: Llama's block with RMSNorm on each query/key head (before RoPE).

Same parameter names as Llama plus layers.{i}.attention.q_norm / k_norm [head_dim]; the norms act
per head, so a plan sharding heads leaves them replicated.
"""

from __future__ import annotations

import mindspore as ms

from ..common.layers import RMSNorm
from ..llama.model import Attention, GQACausalLM, TransformerBlock
from .args import Qwen3Args


class Qwen3Attention(Attention):
    def __init__(self, args: Qwen3Args, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type):
        super().__init__(args, layer_id, compute_dtype, params_dtype)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, params_dtype)
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, params_dtype)

    def norm_qk(self, q, k):
        return self.q_norm(q), self.k_norm(k)


class Qwen3ForCausalLM(GQACausalLM):
    def __init__(self, args: Qwen3Args):
        super().__init__(args, args.head_dim,
                         lambda i, cdt, pdt: TransformerBlock(args, i, cdt, pdt, Qwen3Attention))
