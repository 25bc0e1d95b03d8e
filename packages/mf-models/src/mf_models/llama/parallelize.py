"""Llama's parallel plan: tensor parallelism with sequence parallelism, context parallelism,
recompute, FSDP/HSDP.

    parallelize_llama(model, mesh, ParallelOptions(mf_parallel.Layout.resolve(cfg.parallelism, world)))

Activations between blocks are sequence-sharded when tp > 1 (SP cannot be switched off). Per block:

    attention_norm          SequenceParallel      norm on sequence shards, weight grad all-reduced
    attention               PrepareModuleInput    all-gather the sequence once for wq/wk/wv
    attention.wq/wk/wv      ColwiseParallel       heads split (rows of [nH*hd, H]); input "gathered"
    attention.wo            RowwiseParallel       reduce-scatter back to sequence shards
    ffn_norm                SequenceParallel
    feed_forward            PrepareModuleInput
    feed_forward.w1/w3      ColwiseParallel       intermediate split
    feed_forward.w2         RowwiseParallel
and at the ends: tok_embeddings VocabParallelEmbedding (vocab rows, scattered to sequence shards),
norm SequenceParallel, output ColwiseParallel(input "shard_seq"): the logits stay split along the
vocabulary for `mf_parallel.VocabParallelCrossEntropy`. Tied embeddings get an `output` leaf
sharing the table (`untie_output`), resliced and sharded once.

Attention reshapes with -1 heads and derives the GQA repeat from the tensors, so the model code
runs unchanged on a rank's local heads.

Context parallelism (cp > 1, after TP): every `attention.core` becomes the cp method of the
layout's `context` settings (ring, Ulysses or hybrid, `mf_parallel`) on the local
heads, and the model takes this cp rank's tokens (`common.parallel.apply_context_parallel`). FSDP
then shards over dp_shard x cp: cp ranks hold the same parameters, so they shard them too, and
the reduce-scatter adds the gradients of their sequence chunks.
"""

from __future__ import annotations

import mf_parallel as mp

from ..common.layout import tensor_parallel_problems
from ..common.parallel import (
    ParallelOptions,
    apply_context_parallel,
    apply_expert_parallel,
    apply_fsdp,
    check_context_parallel,
    moe_plan,
    refuse_unimplemented,
    split_sequences,
    untie_output,
)
from ..common.recompute_comm import apply_recompute_comm
from ..errors import ModelConfigError


def attention_plan(prefix: str, attention) -> dict:
    """wq/wk/wv split by heads on the gathered sequence, wo back to sequence shards."""
    return {prefix: mp.PrepareModuleInput(),
            prefix + ".wq": mp.ColwiseParallel(input_layout="gathered"),
            prefix + ".wk": mp.ColwiseParallel(input_layout="gathered"),
            prefix + ".wv": mp.ColwiseParallel(input_layout="gathered"),
            prefix + ".wo": mp.RowwiseParallel()}


def feed_forward_plan(prefix: str) -> dict:
    return {prefix: mp.PrepareModuleInput(),
            prefix + ".w1": mp.ColwiseParallel(input_layout="gathered"),
            prefix + ".w3": mp.ColwiseParallel(input_layout="gathered"),
            prefix + ".w2": mp.RowwiseParallel()}


def ends_plan() -> tuple[dict, dict]:
    """(before the blocks, after them): embedding and final norm + output projection."""
    return ({"tok_embeddings": mp.VocabParallelEmbedding()},
            {"norm": mp.SequenceParallel(), "output": mp.ColwiseParallel(input_layout="shard_seq")})


def tp_plan(model, block_plan=None, extra_plan=None) -> dict:
    """{module path: style} for the whole model; `block_plan(prefix, layer)` per decoder block;
    `extra_plan`: the model's own leaves outside the blocks (GPT-2's position table)."""
    block_plan = block_plan or llama_block_plan
    first, last = ends_plan()
    plan = {**first, **(extra_plan or {})}
    for i, layer in enumerate(model.layers):
        plan.update(block_plan(f"layers.{i}", layer))
    for k, module in enumerate(getattr(model, "mtp", ())):
        plan.update(mtp_plan(f"mtp.{k}", module, block_plan))
    if hasattr(model, "mtp_embeddings"):       # the MTP lookups' leaf sharing the token table
        plan["mtp_embeddings"] = mp.VocabParallelEmbedding()
    plan.update(last)
    return plan


def mtp_plan(prefix: str, module, block_plan) -> dict:
    """A multi-token-prediction module (common/mtp.py) on sequence shards: its norms and the
    projection of [embedding ; hidden] replicated (gradients all-reduced over tp; the embedding of
    the shifted tokens comes out of the vocab-parallel lookup already on this rank's shard), its
    block planned like the decoder's."""
    return {prefix + ".enorm": mp.SequenceParallel(), prefix + ".hnorm": mp.SequenceParallel(),
            prefix + ".eh_proj": mp.SequenceParallel(), prefix + ".norm": mp.SequenceParallel(),
            **block_plan(prefix + ".block", module.block)}


def decoder_block_plan(prefix: str, layer, attention=attention_plan) -> dict:
    """A pre-norm block: norms on sequence shards, `attention(prefix.attention, module)`, then the
    block's MoE (replicated on sequence shards, `moe_plan`) or its split SwiGLU MLP."""
    plan = {prefix + ".attention_norm": mp.SequenceParallel(),
            **attention(prefix + ".attention", layer.attention),
            prefix + ".ffn_norm": mp.SequenceParallel()}
    if getattr(layer, "moe_enabled", False):
        plan.update(moe_plan(prefix + ".moe", layer.moe))
    else:
        plan.update(feed_forward_plan(prefix + ".feed_forward"))
    return plan


def llama_block_plan(prefix: str, layer) -> dict:
    return decoder_block_plan(prefix, layer)


def check_tp(model, dims) -> None:
    """Refuse a tensor_parallel degree that does not split the model (the preflight's own check)."""
    problems = tensor_parallel_problems(model.args, dims.tp, dims.world_size)
    if problems:
        raise ModelConfigError(problems[0])


def parallelize_dense(model, mesh, options: ParallelOptions, model_type: str, block_plan=None, check=None,
                      inner_units=None, experts=None, extra_plan=None):
    """The fixed order for a decoder: TP (+SP), CP, EP (`experts(model)`: the model's expert plan,
    MoE models only), the balance loss over split sequences, recompute, FSDP per block then the
    root. What each strategy does comes from `options.layout` (mf_parallel.Layout)."""
    layout = options.layout_for(mesh)
    dims = layout.dims
    refuse_unimplemented(dims, model_type, experts)
    # Every check before the first change to the model.
    mp.check_cpu_offload(layout.fsdp.cpu_offload)      # rejected with mf-parallel's reason
    if dims.tp_enabled:
        (check or check_tp)(model, dims)
        plan = tp_plan(model, block_plan, extra_plan)
        if options.recompute_comm:
            plan = apply_recompute_comm(plan, model, options.recompute_comm)
    check_context_parallel(model, layout)
    if dims.tp_enabled or dims.fsdp_enabled or dims.dp_replicate > 1:   # FSDP also shards over cp
        untie_output(model)
    if dims.tp_enabled:
        mp.parallelize_module(model, mesh["tp"], plan)
    if dims.cp_enabled:                                 # on the heads tensor parallelism left here
        apply_context_parallel(model, mesh, layout.context)
    if dims.ep_enabled:
        apply_expert_parallel(model, mesh, layout, experts(model))
    split_sequences(model, mesh)                        # the balance loss's counts of whole sequences
    if options.recompute is not None:
        options.recompute(model)
    if dims.fsdp_enabled or dims.dp_replicate > 1:
        apply_fsdp(model, mesh, layout, inner_units)
    return model


def parallelize_llama(model, mesh, options: ParallelOptions | None = None):
    """Shard `model` (a LlamaForCausalLM) in place for `mesh`; returns it. Before the first call."""
    return parallelize_dense(model, mesh, options or ParallelOptions(), "llama")
