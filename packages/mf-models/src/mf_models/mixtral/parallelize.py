"""Mixtral's parallel plan: Llama's attention plan, the MoE replicated on sequence shards
(`common.parallel.moe_plan`), recompute, FSDP/HSDP with the router and the stacked experts as
their own units.

    attention_norm, ffn_norm   SequenceParallel
    attention.wq/wk/wv         ColwiseParallel (gathered input), wo RowwiseParallel
    moe.router.gate, experts   SequenceParallel: every rank routes and computes its own tokens
                               with replicated weights, gradients all-reduced over tp

A balance loss (`output_router_logits: true`) under tensor parallelism is refused
(`tensor_parallel_problems`: also what the preflight says).
"""

from __future__ import annotations

from ..common.parallel import ParallelOptions, expert_plan, moe_units
from ..llama.parallelize import decoder_block_plan, parallelize_dense


def parallelize_mixtral(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a MixtralForCausalLM) in place for `mesh`; returns it. Before the first call.
    What tensor parallelism can split (heads, vocabulary, dense layers' MLP; experts are replicated)
    is MixtralArgs.tensor_parallel_split, checked by the shared check_tp."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "mixtral", decoder_block_plan, None,
                             moe_units, expert_plan)
