"""What every model's `parallelize.py` shares: parameter forwards, plan options, FSDP wrapping.

mf-parallel rewrites parameter-owning leaves (see its README, "How a transform reaches a
parameter"): each leaf class needs a *parameter forward*, a module-level pure function
`fn(cell, *params, *inputs)` that computes the leaf's output from parameters handed to it. The
model's own `construct` methods call these same functions, so the transformed and the plain
model cannot drift apart. Registered here: `Linear`, `Embedding`, `RMSNorm` (also qwen3's per-head
q/k norms and the MLA latent norms), the MoE `TopKRouter` and `GroupedExperts`; and `Linear`'s
backward split into input and weight gradient (pipeline schedules that defer the weight GEMM).

A plan (`llama/parallelize.py`, ...) applies, in this fixed order (TorchTitan's):
  1. tensor parallelism with sequence parallelism (`mf_parallel.parallelize_module`),
  2. activation recomputation (a callback: the YAML's `recompute` section belongs to the trainer),
  3. FSDP/HSDP per block, then the root (`fully_shard`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mindspore import nn

import mf_parallel as mp

from ..errors import ModelConfigError
from .layers import (
    Embedding,
    Linear,
    RMSNorm,
    embedding_forward,
    linear_forward,
    linear_input_grad,
    linear_weight_grad,
    rms_norm_forward,
)
from .layout import divisible_problems
from .moe import GroupedExperts, experts_forward
from .router import TopKRouter, router_forward

mp.register_param_forward(Linear, ("weight", "bias"), linear_forward)
mp.register_param_forward(Embedding, ("weight",), embedding_forward)
mp.register_param_forward(RMSNorm, ("weight",), rms_norm_forward)
mp.register_param_forward(TopKRouter, ("expert_bias",), router_forward)
mp.register_param_forward(GroupedExperts, ("w1", "w2", "w3"), experts_forward)
# Pipeline schedules with a split backward (ZB-H1, ZB-V) defer Linear's weight GEMM.
mp.register_weight_grad_split(Linear, linear_input_grad, linear_weight_grad)


@dataclass(frozen=True)
class ParallelOptions:
    """How a plan shards: the YAML `parallelism` strategy keys, plus the trainer's recompute hook.

    `recompute(model)` marks cells for recomputation; it runs after tensor parallelism (so it sees
    the sharded layers) and before FSDP (whose leaves then live inside the recomputed cells).
    """

    reshard_after_forward_policy: str = "default"
    disable_gradient_division: bool = True
    cpu_offload: bool = False
    recompute: Callable[[nn.Cell], object] | None = None


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


def apply_fsdp(model: nn.Cell, mesh, options: ParallelOptions,
               inner_units: Callable[[nn.Cell], list[nn.Cell]] | None = None) -> None:
    """FSDP (or HSDP, or DDP when dp_shard is 1) per decoder block, then the root. (On a one-rank
    mesh every collective is the identity: the rewritten model computes what the plain one does.)

    `inner_units(block)` lists sub-cells to shard as their own units first, without
    reshard-after-forward (leaves whose parameters + inputs exceed what mf-parallel's recomputing
    backward takes, e.g. stacked experts).
    """
    dims = mesh.dims
    policy = options.reshard_after_forward_policy
    common = dict(disable_gradient_division=options.disable_gradient_division, cpu_offload=options.cpu_offload)
    layers = list(model.layers)
    for i, block in enumerate(layers):
        for unit in (inner_units(block) if inner_units else []):
            mp.fully_shard(unit, mesh, reshard_after_forward=False, **common)
        reshard = mp.reshard_after_forward_for(policy, pp_enabled=dims.pp_enabled, last=i == len(layers) - 1)
        mp.fully_shard(block, mesh, reshard_after_forward=reshard, **common)
    mp.fully_shard(model, mesh, reshard_after_forward=mp.reshard_after_forward_for(
        policy, pp_enabled=dims.pp_enabled, last=True), **common)


def refuse_unimplemented(dims, model_type: str) -> None:
    """Pipeline, context and expert parallelism have no strategy yet: say so, naming the key."""
    for axis, key in (("pp", "pipeline_parallel"), ("cp", "context_parallel"), ("ep", "expert_parallel")):
        if getattr(dims, axis) > 1:
            raise ModelConfigError(f"parallelism.{key}: {getattr(dims, axis)} > 1 is not implemented for "
                                   f"{model_type} (mf-parallel has no {key.replace('_', ' ')} strategy yet); set it to 1")


def moe_plan(prefix: str, moe) -> dict:
    """A MoE layer under tensor parallelism: replicated on the rank's sequence shard (routing,
    experts and shared experts act per token, so this is exact), every trainable leaf's gradient
    all-reduced over tp. Splitting the experts over ranks is expert parallelism, not tp."""
    plan = {prefix + ".router.gate": mp.SequenceParallel(), prefix + ".experts": mp.SequenceParallel()}
    if moe.has_shared:
        plan.update({f"{prefix}.shared_experts.{w}": mp.SequenceParallel() for w in ("w1", "w2", "w3")})
    return plan


def moe_units(block) -> list:
    """FSDP units inside a MoE block: the router (its parameter forward calls its gate) and the
    stacked experts (3 parameters + 2 inputs, beyond mf-parallel's recomputing backward), both
    without reshard-after-forward."""
    return [block.moe.router, block.moe.experts] if getattr(block, "moe_enabled", False) else []
