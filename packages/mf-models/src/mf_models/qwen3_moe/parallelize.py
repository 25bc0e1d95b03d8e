"""Qwen3-MoE's parallel plan: Qwen3's block plan (q/k norms replicated, gradients all-reduced
over tp), MoE layers replicated on sequence shards, dense layers split like Llama's MLP,
recompute, FSDP/HSDP (router and stacked experts as their own units). See mixtral/parallelize.py.
"""

from __future__ import annotations

from ..common.parallel import ParallelOptions, expert_plan, moe_units
from ..llama.parallelize import parallelize_dense
from ..qwen3.parallelize import qwen3_block_plan


def parallelize_qwen3_moe(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a Qwen3MoeForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "qwen3_moe", qwen3_block_plan, None,
                             moe_units, expert_plan)
