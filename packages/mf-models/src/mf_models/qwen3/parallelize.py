"""Qwen3's parallel plan: Llama's, plus the per-head q/k norms.

`attention.q_norm` / `k_norm` act on each head of [B, S, heads, head_dim]; under tensor
parallelism a rank holds its own heads of the full sequence, so the norm weights stay replicated
and each rank's weight gradient covers only its heads: `SequenceParallel` all-reduces it over tp
(the same rule as a norm on sequence shards: a replicated weight applied to a slice of the work).
"""

from __future__ import annotations

import mf_parallel as mp

from ..common.parallel import ParallelOptions
from ..llama.parallelize import attention_plan, decoder_block_plan, parallelize_dense


def qwen3_attention_plan(prefix: str, attention) -> dict:
    return {**attention_plan(prefix, attention),
            prefix + ".q_norm": mp.SequenceParallel(), prefix + ".k_norm": mp.SequenceParallel()}


def qwen3_block_plan(prefix: str, layer) -> dict:
    """Llama's block plan with qwen3's attention (also qwen3_moe's, whose MoE layers it handles)."""
    return decoder_block_plan(prefix, layer, qwen3_attention_plan)


def parallelize_qwen3(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a Qwen3ForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "qwen3", qwen3_block_plan)
