"""Qwen2-MoE: Qwen2's attention, routed MoE layers (Qwen3-MoE's softmax router) with one shared
expert scaled by a sigmoid gate, and dense SwiGLU layers where `mlp_only_layers` /
`decoder_sparse_step` say so.

Parameters: Qwen2's attention names (q/k/v biases when qkv_bias); MoE layers
layers.{i}.moe.router.gate.weight [E, H], moe.experts.w1/w3 [E, I_moe, H], .w2 [E, H, I_moe],
moe.shared_experts.w1/w2/w3, moe.shared_expert_gate.weight [1, H]; dense layers feed_forward.*.
"""

from __future__ import annotations

from ..common.moe import MoE
from ..llama.model import GQACausalLM, TransformerBlock
from ..mixtral.model import switch_balance
from ..qwen3_moe.model import router_spec
from .args import Qwen2MoeArgs


class Qwen2MoeForCausalLM(GQACausalLM):
    def __init__(self, args: Qwen2MoeArgs):
        balance = switch_balance(args)

        def block(i, cdt, pdt):
            moe = None
            if args.is_moe_layer(i):
                moe = MoE(args.hidden_size, args.moe_intermediate_size, router_spec(args),
                          args.shared_expert_intermediate_size, balance.active, pdt, cdt, shared_gate=True)
            return TransformerBlock(args, i, cdt, pdt, moe=moe)

        super().__init__(args, args.head_dim, block)
        self.balance = balance
        self.num_experts = args.num_experts
        self.top_k = args.num_experts_per_tok
