"""What every model's `parallelize.py` shares: parameter forwards, plan options, FSDP wrapping.

mf-parallel rewrites parameter-owning leaves (see its README, "How a transform reaches a
parameter"): each leaf class needs a *parameter forward*, a module-level pure function
`fn(cell, *params, *inputs)` that computes the leaf's output from parameters handed to it. The
model's own `construct` methods call these same functions, so the transformed and the plain
model cannot drift apart. Registered here: `Linear`, `Embedding`, `RMSNorm` (also qwen3's per-head
q/k norms and the MLA latent norms), GPT-2's `LayerNorm`, the MoE `TopKRouter` and `GroupedExperts`;
`Linear`'s
backward split into input and weight gradient (pipeline schedules that defer the weight GEMM); and
`Linear` as linear terms (the output projection fused with the loss, `mf_parallel.
LinearCrossEntropy`, reads a planned head's input and weight through them).

A plan (`llama/parallelize.py`, ...) applies, in this fixed order (TorchTitan's):
  1. tensor parallelism with sequence parallelism (`mf_parallel.parallelize_module`),
  2. context parallelism: every attention core replaced by the cp method, on the heads tensor
     parallelism left this rank (`apply_context_parallel`),
  3. expert parallelism: each MoE layer's stacked experts split over the ep group and its
     dispatcher replaced by the all-to-all one, or the two-level one of `alltoall_deredundancy`
     (`apply_expert_parallel`; the model's plan names the expert parameters: `expert_plan`),
  4. activation recomputation (a callback: the YAML's `recompute` section belongs to the trainer),
  5. FSDP/HSDP per block, then the root (`fully_shard`, over dp_shard x cp; the experts already
     sit on their own mesh view, dp_shard_mod_ep, and are left alone).

Context parallelism and the model's inputs. A context-parallel model is called as
`model(input_ids, position_ids, segment_ids)` with this cp rank's tokens (`mf_parallel.
slice_for_context_parallel`: its two zigzag chunks, global positions) and the global document ids
of packed samples, or None for plain causal attention. No model file changes: `CausalLM`'s
attention-context argument (`cache`: `begin` / `causal_mask` / `update`, the KV cache in
generation) receives a `ContextParallelInputs`, which gives the blocks the global positions of
the local tokens and hands the segment ids, instead of a local [S/cp, S/cp] causal mask, to the
replaced attention cores.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import mindspore as ms
from mindspore import nn, ops

import mf_parallel as mp

from ..errors import ModelConfigError
from .attention import CoreAttention
from .dispatch import LocalDispatcher
from .layers import (
    Embedding,
    LayerNorm,
    Linear,
    RMSNorm,
    embedding_forward,
    layer_norm_forward,
    linear_forward,
    linear_forward_terms,
    linear_input_grad,
    linear_weight_grad,
    rms_norm_forward,
)
from .layout import divisible_problems
from .logs import log_once
from .moe import GroupedExperts, experts_forward
from .router import TopKRouter, router_forward

mp.register_param_forward(Linear, ("weight", "bias"), linear_forward)
# The output projection fused with the loss (mf_parallel.LinearCrossEntropy) under a plan too.
mp.register_linear_terms(Linear, linear_forward_terms)
mp.register_param_forward(Embedding, ("weight",), embedding_forward)
mp.register_param_forward(RMSNorm, ("weight",), rms_norm_forward)
mp.register_param_forward(LayerNorm, ("weight", "bias"), layer_norm_forward)
mp.register_param_forward(TopKRouter, ("expert_bias",), router_forward)
mp.register_param_forward(GroupedExperts, ("w1", "w2", "w3"), experts_forward)
# Pipeline schedules with a split backward (ZB-H1, ZB-V) defer Linear's weight GEMM.
mp.register_weight_grad_split(Linear, linear_input_grad, linear_weight_grad)


@dataclass(frozen=True)
class ParallelOptions:
    """How a plan shards: the resolved layout (`mf_parallel.Layout`: FSDP options, CP settings, the
    MoE dispatcher; None: every default for the mesh's world split), plus the trainer's hooks.

    `recompute(model)` marks cells for recomputation; it runs after tensor and context parallelism
    (so it sees the sharded layers) and before FSDP (whose leaves then live inside the recomputed
    cells). `recompute_comm`: layer index -> modules ("attention", "feed_forward") whose
    sequence-parallel input all-gather is re-done in backward (common/recompute_comm.py); acts
    with tp > 1.
    """

    layout: mp.Layout | None = None
    recompute: Callable[[nn.Cell], object] | None = None
    recompute_comm: Mapping[int, frozenset[str]] | None = None

    def layout_for(self, mesh) -> mp.Layout:
        """The layout to apply on `mesh`: it must be the one the mesh was made from."""
        if self.layout is None:
            return mp.Layout.for_dims(mesh.dims)
        if self.layout.dims != mesh.dims:
            raise ModelConfigError(f"parallelize: the layout was resolved for {self.layout.describe()}, the mesh is "
                                   f"{mesh.dims.describe()}")
        return self.layout


def check_divisible(tp: int, **sizes: int) -> None:
    """One line naming the model key when tensor_parallel does not divide a sharded dimension."""
    problems = divisible_problems(tp, **sizes)
    if problems:
        raise ModelConfigError(problems[0])


def untie_output(model: nn.Cell) -> None:
    """Give a tied model an `output` Linear whose weight IS the embedding table (one Parameter).

    `CausalLM.head` multiplies by `tok_embeddings.weight` directly when embeddings are tied, which a
    strategy cannot reach (it rewrites leaves, and a sharded table is not the full matrix). With a
    real output leaf sharing the Parameter, tensor parallelism reslices it once (vocab rows, as the
    embedding) and FSDP shards it once; both leaves gather it and both gradients add up. The shared
    Parameter keeps its name, so checkpoints and optimizer states are unchanged (one tensor,
    `tok_embeddings.weight`).
    """
    if not getattr(model, "tie_word_embeddings", False):
        return
    table = model.tok_embeddings.weight
    name = table.name
    out = Linear(model.args.hidden_size, model.args.vocab_size, False, model.params_dtype, model.compute_dtype)
    out.weight = table
    model.output = out
    table.name = name      # attaching a sub-cell renames its parameters with the attribute prefix
    model.tie_word_embeddings = False


def apply_fsdp(model: nn.Cell, mesh, layout: mp.Layout,
               inner_units: Callable[[nn.Cell], list[nn.Cell]] | None = None) -> None:
    """FSDP (or HSDP, or DDP when dp_shard is 1) per decoder block, then the root. (On a one-rank
    mesh every collective is the identity: the rewritten model computes what the plain one does.)

    `inner_units(block)` lists sub-cells to shard as their own units first, without
    reshard-after-forward (leaves whose parameters + inputs exceed what mf-parallel's recomputing
    backward takes, e.g. stacked experts).
    """
    common = dict(disable_gradient_division=layout.fsdp.disable_gradient_division,
                  cpu_offload=layout.fsdp.cpu_offload)
    # the multi-token-prediction modules' blocks are units like the decoder's (their norms and
    # projection go with the root)
    layers = list(model.layers) + [module.block for module in getattr(model, "mtp", ())]
    for i, block in enumerate(layers):
        for unit in (inner_units(block) if inner_units else []):
            mp.fully_shard(unit, mesh, reshard_after_forward=False, **common)
        mp.fully_shard(block, mesh, reshard_after_forward=layout.reshard_after_forward(last=i == len(layers) - 1),
                       **common)
    mp.fully_shard(model, mesh, reshard_after_forward=layout.reshard_after_forward(last=True), **common)


def refuse_unimplemented(dims, model_type: str, expert_plan=None) -> None:
    """Expert parallelism needs a model with experts (its plan names them: `expert_plan`), and is
    nothing else: say so, naming the key. Beside tensor parallelism the MoE runs on each tp rank's
    sequence shard (`moe_plan`): its experts split over ep, replicated over tp, gradients
    all-reduced there. Beside context parallelism the ep ranks are carved out of dp_shard x cp: each
    routes the tokens of its own sequence chunks. Pipeline stages are not a plan: the trainer cuts
    the planned model with `pipeline_stage`, and each stage's MoE layers exchange tokens within the
    stage's own ep group (which pipeline layouts are proven is the trainer's preflight)."""
    if not dims.ep_enabled:
        return
    if expert_plan is None:
        raise ModelConfigError(f"parallelism.expert_parallel: {dims.ep} > 1, but {model_type} has no routed experts; "
                               "set it to 1")


# The stacked expert weights of the one MoE layer (common/moe.py): dim 0 is the expert axis.
EXPERT_PARAMS = ("w1", "w2", "w3")


def expert_plan(model) -> dict[str, tuple[str, ...]]:
    """Which parameters are experts, by leaf path: every MoE layer's stacked experts, the multi-
    token-prediction blocks' included (the shared experts are dense and stay with the other
    weights)."""
    plan = {f"layers.{i}.moe.experts": EXPERT_PARAMS
            for i, block in enumerate(model.layers) if getattr(block, "moe_enabled", False)}
    plan.update({f"mtp.{k}.block.moe.experts": EXPERT_PARAMS
                 for k, module in enumerate(getattr(model, "mtp", ())) if module.moe_enabled})
    return plan


def apply_expert_parallel(model, mesh, layout: mp.Layout, plan: dict[str, tuple[str, ...]]) -> None:
    """Split the experts `plan` names over the ep group (`mf_parallel.shard_experts`) and give each
    of their MoE layers the layout's dispatcher: the all-to-all one (`alltoall`) or the two-level
    one (`alltoall_deredundancy`: device groups of `npu_nums_per_device` ep ranks), over a
    one-rank dispatcher of the local experts plus the null expert of empty slots."""
    cells = dict(model.cells_and_names())
    group = mesh["ep"]
    two_level = None
    if layout.dispatcher.type == "alltoall_deredundancy":
        two_level = mp.two_level_groups(mesh, layout.dispatcher.npu_nums_per_device)
    for path, names in plan.items():
        experts = cells.get(path)
        moe = cells.get(path.rpartition(".")[0])
        if experts is None or moe is None or not hasattr(moe, "dispatcher"):
            raise ModelConfigError(f"expert plan: {path} is not the experts of a MoE layer of {type(model).__name__}")
        if moe.num_experts % group.size:
            raise ModelConfigError(f"parallelism.expert_parallel: {group.size} does not divide the model's "
                                   f"{moe.num_experts} routed experts; use a divisor of {moe.num_experts}")
        mp.shard_experts(experts, mesh, names, disable_gradient_division=layout.fsdp.disable_gradient_division)
        local = LocalDispatcher(moe.num_experts // group.size + 1, 1)
        if two_level is None:
            moe.dispatcher = mp.AllToAllTokenDispatcher(group, moe.num_experts, moe.top_k, local)
        else:
            moe.dispatcher = mp.DeredundancyTokenDispatcher(*two_level, moe.num_experts, moe.top_k, local)


def moe_plan(prefix: str, moe) -> dict:
    """A MoE layer under tensor parallelism: replicated on the rank's sequence shard (routing,
    experts and shared experts act per token, so this is exact), every trainable leaf's gradient
    all-reduced over tp. Splitting the experts over ranks is expert parallelism, not tp."""
    plan = {prefix + ".router.gate": mp.SequenceParallel(), prefix + ".experts": mp.SequenceParallel()}
    if moe.has_shared:
        plan.update({f"{prefix}.shared_experts.{w}": mp.SequenceParallel() for w in ("w1", "w2", "w3")})
    if getattr(moe, "shared_gated", False):
        plan[prefix + ".shared_expert_gate"] = mp.SequenceParallel()
    return plan


def moe_units(block) -> list:
    """FSDP units inside a MoE block: the router (its parameter forward calls its gate) and the
    stacked experts (3 parameters + 2 inputs, beyond mf-parallel's recomputing backward), both
    without reshard-after-forward."""
    return [block.moe.router, block.moe.experts] if getattr(block, "moe_enabled", False) else []


# ----------------------------------------------------------------------------- context parallelism
def check_context_parallel(model: nn.Cell, layout: mp.Layout) -> None:
    """The layout's cp settings against `model` (before any change to it): the method's needs
    against the heads a tensor-parallel rank holds and the sequence length."""
    dims = layout.dims
    if not dims.cp_enabled:
        return
    heads = model.args.num_attention_heads // dims.tp
    kv_heads = model.kv_cache_shapes()[0][0] // dims.tp
    mp.check_context_parallel(dims, layout.context, heads, kv_heads, model.args.seq_length)


class ContextParallelInputs(nn.Cell):
    """`CausalLM`'s attention-context protocol for cp rank `cp_rank` of `cp`: `begin(seq)` gives the
    global positions of the rank's local tokens (its zigzag chunks; the default RoPE positions),
    `causal_mask` hands the model's third input (segment ids or None) through to the attention
    cores, and `update` leaves keys and values as they are (nothing is cached)."""

    def __init__(self, cp: int, cp_rank: int) -> None:
        super().__init__()
        self.cp = cp
        self.cp_rank = cp_rank

    def begin(self, seq):
        c = seq // 2
        first, second = self.cp_rank, 2 * self.cp - 1 - self.cp_rank
        return ops.Concat(0)((ops.arange(first * c, (first + 1) * c, dtype=ms.int32),
                              ops.arange(second * c, (second + 1) * c, dtype=ms.int32)))

    def causal_mask(self, query_positions, attention_mask=None):
        return attention_mask

    def update(self, layer_id, k, v):
        return k, v


def _context_parallel_construct(self, input_ids, position_ids=None, segment_ids=None):
    return self._mf_cp_base.construct(self, input_ids, position_ids, segment_ids, self.mf_cp_inputs)


def _context_parallel_forward_train_hidden(self, input_ids, position_ids=None, segment_ids=None):
    return self._mf_cp_base.trunk(self, input_ids, position_ids, segment_ids, self.mf_cp_inputs, True)


class SplitSequences(nn.Cell):
    """`CausalLM.sequences` when ranks hold pieces of every sequence (the `cp_tp` group: context-
    parallel chunks, each split again by sequence parallelism under tp): the balance loss's
    per-sequence counts are summed over those ranks (not differentiated), and the model's input is
    one of `cp` chunks of the sequence (sequence parallelism splits after the embedding). Each rank
    then computes its share of the balance loss (see common/balancing.py)."""

    def __init__(self, group, cp: int) -> None:
        super().__init__()
        self.sum = mp.AllReduce(group)
        self.seq_parts = cp

    def construct(self, counts):
        return self.sum(ops.stop_gradient(counts))


def split_sequences(model: nn.Cell, mesh) -> None:
    """Give a MoE model trained with a balance loss the whole sequences' counts when tensor
    (sequence) or context parallelism splits its sequences over ranks."""
    dims = mesh.dims
    if model.moe_layer_ids() and model.balance.active and dims.cp * dims.tp > 1:
        model.sequences = SplitSequences(mesh["cp_tp"], dims.cp)


def apply_context_parallel(model: nn.Cell, mesh, settings: mp.ContextParallelSettings) -> None:
    """Replace every `CoreAttention` under `model` by the cp method (`mf_parallel.
    context_parallel_attention`) and make the model take (input_ids, position_ids, segment_ids) of
    this cp rank. After tensor parallelism: the cores then see the rank's local heads."""
    cells = dict(model.cells_and_names())
    cores = [(path, cell) for path, cell in cells.items() if isinstance(cell, CoreAttention)]
    if not cores:
        raise ModelConfigError(f"parallelism.context_parallel: {type(model).__name__} has no CoreAttention to replace")
    for path, core in cores:
        if core.use_flash and settings.method != "ulysses":
            log_once(f"use_flash_attention: context_parallel_method {settings.method!r} computes attention blockwise "
                     "around the ring itself; the fused kernel is used by 'ulysses' only", logging.INFO)
        parent_path, _, attr = path.rpartition(".")
        setattr(cells[parent_path], attr, mp.context_parallel_attention(mesh, settings, scale=core.scale, inner=core))
    base = type(model)
    model.__class__ = type(f"ContextParallel{base.__name__}", (base,),
                           {"construct": _context_parallel_construct,
                            "forward_train_hidden": _context_parallel_forward_train_hidden,
                            "_mf_cp_base": base})
    model.mf_cp_inputs = ContextParallelInputs(mesh.dims.cp, mesh.dims.coordinate("cp", mesh.rank))
