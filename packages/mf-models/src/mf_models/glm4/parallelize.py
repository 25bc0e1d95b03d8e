"""GLM-4's parallel plan: Llama's (tensor + sequence parallelism, context parallelism, recompute,
FSDP/HSDP), with the two post norms replicated on sequence shards like the others (the attention's
and the MLP's outputs are back on sequence shards when they reach them)."""

from __future__ import annotations

import mf_parallel as mp

from ..common.parallel import ParallelOptions
from ..llama.parallelize import decoder_block_plan, parallelize_dense


def glm4_block_plan(prefix: str, layer) -> dict:
    return {**decoder_block_plan(prefix, layer), prefix + ".attention_post_norm": mp.SequenceParallel(),
            prefix + ".ffn_post_norm": mp.SequenceParallel()}


def parallelize_glm4(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a Glm4ForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "glm4", glm4_block_plan)
