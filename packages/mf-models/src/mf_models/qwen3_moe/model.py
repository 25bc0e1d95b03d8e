"""Qwen3-MoE: Qwen3's attention, routed MoE layers (softmax router, no shared expert) and, where
`mlp_only_layers` / `decoder_sparse_step` say so, dense SwiGLU layers.

Parameters: Qwen3's attention names; MoE layers layers.{i}.moe.router.gate.weight [E, H],
layers.{i}.moe.experts.w1/w3 [E, I_moe, H], .w2 [E, H, I_moe]; dense layers layers.{i}.feed_forward.*.
"""

from __future__ import annotations

from ..common.moe import MoE
from ..common.router import RouterSpec
from ..llama.model import GQACausalLM, TransformerBlock
from ..mixtral.model import switch_balance
from ..qwen3.model import Qwen3Attention
from .args import Qwen3MoeArgs


def router_spec(args: Qwen3MoeArgs) -> RouterSpec:
    """Qwen3MoeTopKRouter: softmax over all experts, top-k, renormalised only with norm_topk_prob."""
    return RouterSpec(args.num_experts, args.num_experts_per_tok, "softmax", norm_topk_prob=args.norm_topk_prob)


class Qwen3MoeForCausalLM(GQACausalLM):
    def __init__(self, args: Qwen3MoeArgs):
        balance = switch_balance(args)

        def block(i, cdt, pdt):
            moe = None
            if args.is_moe_layer(i):
                moe = MoE(args.hidden_size, args.moe_intermediate_size, router_spec(args), 0, balance.active, pdt, cdt)
            return TransformerBlock(args, i, cdt, pdt, Qwen3Attention, moe=moe)

        super().__init__(args, args.head_dim, block)
        self.balance = balance
        self.num_experts = args.num_experts
        self.top_k = args.num_experts_per_tok
