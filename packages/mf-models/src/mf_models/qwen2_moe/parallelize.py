"""Qwen2-MoE's parallel plan: Llama's block plan (q/k/v biases sliced with their heads), MoE layers
replicated on sequence shards (router, experts, shared expert and its gate, gradients all-reduced
over tp), dense layers split like Llama's MLP; experts split over ep (expert parallelism),
recompute, FSDP/HSDP with the router and the stacked experts as their own units."""

from __future__ import annotations

from ..common.parallel import ParallelOptions, expert_plan, moe_units
from ..llama.parallelize import parallelize_dense


def parallelize_qwen2_moe(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a Qwen2MoeForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "qwen2_moe", None, None, moe_units,
                             expert_plan)
