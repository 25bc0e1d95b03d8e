"""GPT-2's parallel plan: Llama's (tensor + sequence parallelism, recompute, FSDP/HSDP), with the
LayerNorms' weights and biases replicated on sequence shards, the GELU MLP's w1 column- and w2
row-parallel, and the position table split by rows like the vocabulary: its partial lookups are
reduce-scattered to the sequence shards the token embedding's are, so their sum is each rank's
shard of the blocks' input (Megatron adds them before scattering; the sum is the same).
"""

from __future__ import annotations

import mf_parallel as mp

from ..common.parallel import ParallelOptions
from ..llama.parallelize import decoder_block_plan, parallelize_dense


def gelu_feed_forward_plan(prefix: str) -> dict:
    return {prefix: mp.PrepareModuleInput(),
            prefix + ".w1": mp.ColwiseParallel(input_layout="gathered"),
            prefix + ".w2": mp.RowwiseParallel()}


def gpt2_block_plan(prefix: str, layer) -> dict:
    plan = decoder_block_plan(prefix, layer)
    for key in [k for k in plan if k.startswith(prefix + ".feed_forward")]:
        del plan[key]
    plan.update(gelu_feed_forward_plan(prefix + ".feed_forward"))
    return plan


def parallelize_gpt2(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a GPT2LMHeadModel) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "gpt2", gpt2_block_plan,
                             extra_plan={"pos_embeddings": mp.VocabParallelEmbedding()})
