"""Mixtral's parallel plan: Llama's attention plan, the MoE replicated on sequence shards
(`common.parallel.moe_plan`), recompute, FSDP/HSDP with the router and the stacked experts as
their own units.

    attention_norm, ffn_norm   SequenceParallel
    attention.wq/wk/wv         ColwiseParallel (gathered input), wo RowwiseParallel
    moe.router.gate, experts   SequenceParallel: every rank routes and computes its own tokens
                               with replicated weights, gradients all-reduced over tp

A balance loss (`output_router_logits: true`) under tensor parallelism is refused
(`check_balance_loss_tp`).
"""

from __future__ import annotations

from ..common.parallel import ParallelOptions, check_balance_loss_tp, check_divisible, moe_units
from ..llama.parallelize import decoder_block_plan, parallelize_dense


def check_moe_tp(model, dims) -> None:
    """Heads and vocabulary split by tp (experts are not); dense layers' MLP too."""
    check_balance_loss_tp(model, dims)
    args = model.args
    dims.check_heads(args.num_attention_heads, args.num_key_value_heads)
    sizes = {"vocab_size": args.vocab_size}
    if len(model.moe_layer_ids()) < len(model.layers):
        sizes["intermediate_size"] = args.intermediate_size
    check_divisible(dims.tp, **sizes)


def parallelize_mixtral(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a MixtralForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "mixtral", decoder_block_plan, check_moe_tp,
                             moe_units)
