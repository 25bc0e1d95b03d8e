"""GLM-4.5: GLM-4's partial rotary (rotate_half order here) on Llama's GQA attention with optional
per-head q/k norms, and DeepSeek-V3's MoE blocks from layer `first_k_dense_replace` on.

Parameters: Llama's attention names (q/k/v biases when attention_bias; attention.q_norm / k_norm
[head_dim] with use_qk_norm); dense layers feed_forward.w1/w2/w3; MoE layers moe.router.gate
[E, H] and moe.router.expert_bias [E], moe.experts.w1/w2/w3 (stacked), moe.shared_experts.*;
with `mtp`, DeepSeek-V3's multi-token-prediction modules mtp.{k} (common/mtp.py).
"""

from __future__ import annotations

import mindspore as ms

from ..common.layers import RMSNorm
from ..deepseek_v3.model import balance_spec, deepseek_moe
from ..glm4.model import Glm4Attention
from ..llama.model import GQACausalLM, TransformerBlock
from .args import Glm4MoeArgs


class Glm4MoeAttention(Glm4Attention):
    """GQA attention, partial rotary in rotate_half order, per-head q/k norms with use_qk_norm."""

    interleaved = False

    def __init__(self, args: Glm4MoeArgs, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type):
        super().__init__(args, layer_id, compute_dtype, params_dtype)
        self.qk_norm = args.use_qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps, params_dtype)
            self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps, params_dtype)

    def norm_qk(self, q, k):
        if self.qk_norm:
            return self.q_norm(q), self.k_norm(k)
        return q, k


class Glm4MoeForCausalLM(GQACausalLM):
    def __init__(self, args: Glm4MoeArgs, mtp: bool = False):
        def block(i, cdt, pdt):
            moe = deepseek_moe(args, cdt, pdt, float("-inf")) if i >= args.first_k_dense_replace else None
            return TransformerBlock(args, i, cdt, pdt, Glm4MoeAttention, moe=moe)

        super().__init__(args, args.rotary_dim, block, mtp_layers=args.num_nextn_predict_layers if mtp else 0)
        self.balance = balance_spec(args)
        self.num_experts = args.n_routed_experts
        self.top_k = args.num_experts_per_tok
