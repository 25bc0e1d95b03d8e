"""DeepSeek-V3's parallel plan: tensor parallelism (+SP) for MLA and the dense blocks, the MoE
blocks on sequence shards, recompute, FSDP/HSDP.

Multi-head latent attention under tp (the block input is all-gathered once, PrepareModuleInput):

    wq | wq_b, wkv_b        ColwiseParallel, input "gathered"   split by heads
    wq_a, q_norm, wkv_a,    SequenceParallel                    the latent path stays replicated;
    kv_norm                                                      each rank's weight gradient covers
                                                                 its heads only -> all-reduced over tp
    wo                      RowwiseParallel                     back to sequence shards

The latent projections' input gradients are partial per rank as well, and the gather's backward
(a reduce-scatter) adds them up, as for wq/wk/wv in Llama. Dense blocks (i < first_k_dense_replace)
shard their SwiGLU like Llama.

MoE blocks are *not* split by tensor parallelism: routing, experts and shared experts act per
token, so each tp rank runs the whole MoE on its own sequence shard with replicated weights
(`SequenceParallel`: gradients all-reduced over tp). That is exact; it is data parallelism over
the sequence for the experts. Splitting experts across ranks is expert parallelism (`expert_plan`;
beside tp the experts are split over ep and stay replicated, gradients all-reduced, over tp).

FSDP: the router and the stacked experts are their own units without reshard-after-forward (the
router calls its gate inside its parameter forward; the experts take 3 parameters + 2 inputs,
beyond what mf-parallel's recomputing backward takes); everything else follows the policy.
"""

from __future__ import annotations

import mf_parallel as mp

from ..common.parallel import ParallelOptions, expert_plan, moe_units
from ..llama.parallelize import decoder_block_plan, parallelize_dense


def attention_plan(prefix: str, attention) -> dict:
    plan = {prefix: mp.PrepareModuleInput()}
    if attention.q_lora:
        plan.update({prefix + ".wq_a": mp.SequenceParallel(), prefix + ".q_norm": mp.SequenceParallel(),
                     prefix + ".wq_b": mp.ColwiseParallel(input_layout="gathered")})
    else:
        plan[prefix + ".wq"] = mp.ColwiseParallel(input_layout="gathered")
    plan.update({prefix + ".wkv_a": mp.SequenceParallel(), prefix + ".kv_norm": mp.SequenceParallel(),
                 prefix + ".wkv_b": mp.ColwiseParallel(input_layout="gathered"),
                 prefix + ".wo": mp.RowwiseParallel()})
    return plan


def deepseek_block_plan(prefix: str, layer) -> dict:
    return decoder_block_plan(prefix, layer, attention_plan)


def parallelize_deepseek_v3(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a DeepseekV3ForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "deepseek_v3", deepseek_block_plan,
                             None, moe_units, expert_plan)
