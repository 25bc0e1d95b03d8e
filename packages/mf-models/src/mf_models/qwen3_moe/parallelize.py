"""Qwen3-MoE's parallel plan: Qwen3's attention plan (q/k norms replicated, gradients all-reduced
over tp), MoE layers replicated on sequence shards, dense layers split like Llama's MLP,
recompute, FSDP/HSDP (router and stacked experts as their own units). See mixtral/parallelize.py.
"""

from __future__ import annotations

import mf_parallel as mp

from ..common.parallel import ParallelOptions, moe_units
from ..llama.parallelize import attention_plan, parallelize_dense
from ..mixtral.parallelize import check_moe_tp, moe_block_plan


def qwen3_attention_plan(prefix: str, attention) -> dict:
    return {**attention_plan(prefix, attention),
            prefix + ".q_norm": mp.SequenceParallel(), prefix + ".k_norm": mp.SequenceParallel()}


def qwen3_moe_block_plan(prefix: str, layer) -> dict:
    return moe_block_plan(prefix, layer, qwen3_attention_plan)


def parallelize_qwen3_moe(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a Qwen3MoeForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "qwen3_moe", qwen3_moe_block_plan,
                             check_moe_tp, moe_units)
