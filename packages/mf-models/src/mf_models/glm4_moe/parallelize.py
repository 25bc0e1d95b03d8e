"""GLM-4.5's parallel plan: Llama's block plan on GQA attention (q/k norms replicated, gradients
all-reduced over tp, as Qwen3's), MoE blocks replicated on sequence shards, dense layers split like
Llama's MLP; experts over ep, recompute, FSDP/HSDP with routers and stacked experts as their own
units; the MTP modules, when built, planned like the decoder blocks (common/mtp.py)."""

from __future__ import annotations

from ..common.parallel import ParallelOptions, expert_plan, moe_units
from ..llama.parallelize import decoder_block_plan, parallelize_dense
from ..qwen3.parallelize import qwen3_block_plan


def glm4_moe_block_plan(prefix: str, layer) -> dict:
    """Qwen3's block plan (q/k norms) with use_qk_norm, Llama's otherwise; MoE blocks as moe_plan."""
    return qwen3_block_plan(prefix, layer) if layer.attention.qk_norm else decoder_block_plan(prefix, layer)


def parallelize_glm4_moe(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a Glm4MoeForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "glm4_moe", glm4_moe_block_plan, None,
                             moe_units, expert_plan)
