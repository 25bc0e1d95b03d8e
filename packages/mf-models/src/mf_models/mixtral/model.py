"""Mixtral: Llama's attention and a routed MoE (no shared expert) in every layer.

Parameters: Llama's attention names, and layers.{i}.moe.router.gate.weight [E, H],
layers.{i}.moe.experts.w1/w3 [E, I, H], .w2 [E, H, I] (HF's block_sparse_moe.experts.{e}.w1/w3/w2).
"""

from __future__ import annotations

from ..common.balancing import BalanceSpec
from ..common.moe import MoE
from ..common.router import RouterSpec
from ..llama.model import GQACausalLM, TransformerBlock
from .args import MixtralArgs


def router_spec(args: MixtralArgs) -> RouterSpec:
    """MixtralTopKRouter: softmax over all experts, top-k, renormalised (no eps), no scaling."""
    return RouterSpec(args.num_local_experts, args.num_experts_per_tok, "softmax", norm_topk_prob=True)


def switch_balance(args) -> BalanceSpec:
    """transformers adds the load-balancing loss only with output_router_logits (Mixtral, Qwen3-MoE)."""
    return BalanceSpec("switch", args.router_aux_loss_coef) if args.output_router_logits else BalanceSpec()


class MixtralForCausalLM(GQACausalLM):
    def __init__(self, args: MixtralArgs):
        spec, balance = router_spec(args), switch_balance(args)

        def block(i, cdt, pdt):
            moe = MoE(args.hidden_size, args.intermediate_size, spec, 0, balance.active, pdt, cdt)
            return TransformerBlock(args, i, cdt, pdt, moe=moe)

        super().__init__(args, args.head_dim, block)
        self.balance = balance
        self.num_experts = args.num_local_experts
        self.top_k = args.num_experts_per_tok
