"""Tensor parallelism with sequence parallelism, as styles a per-model plan applies by path:

    parallelize_module(model, mesh["tp"], {
        "tok_embeddings": VocabParallelEmbedding(),                 # output: sequence-sharded
        "layers.0.attention_norm": SequenceParallel(),
        "layers.0.attention": PrepareModuleInput(),                  # all-gather the sequence once
        "layers.0.attention.wq": ColwiseParallel(input_layout="gathered"),
        "layers.0.attention.wo": RowwiseParallel(),                  # reduce-scatter to sequence shards
        ...
        "output": ColwiseParallel(input_layout="shard_seq"),         # logits stay vocab-sharded
    })

Layouts (activations are [batch, seq, hidden]; `seq_axis` defaults to 1):
  "shard_seq"  each rank holds its slice of the sequence (sequence parallelism)
  "replicate"  every rank holds the same full tensor
  "gathered"   full tensor produced by an upstream all-gather whose backward already reduces the
               gradient (PrepareModuleInput), so this layer must not reduce it again
  "shard"      split along the feature axis (the output of a column-parallel layer)

Weights are [out, in]: ColwiseParallel keeps rows out/tp (and the bias slice), RowwiseParallel
keeps columns in/tp and adds the full bias after the reduction. Parameters replicated over tp but
used on sequence shards (norm weights, row-parallel bias) get their gradient all-reduced over tp.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mf_parallel.autograd import (
    CopyToGroup,
    GatherFromGroup,
    GatherSplit,
    ReduceFromGroup,
    ReduceScatterToGroup,
)
from mf_parallel.errors import ParallelConfigError
from mf_parallel.leaf import TPShard, ensure_plan, install, plan_of
from mf_parallel.mesh import Group

_INPUTS = ("shard_seq", "replicate", "gathered")


def _check(value: str, allowed: tuple[str, ...], what: str) -> str:
    if value not in allowed:
        raise ParallelConfigError(f"{what}: must be one of {', '.join(allowed)}, got {value!r}")
    return value


# Parameters shared by several leaves (tied embedding/output) are resliced once: id(original) -> new.
_RESLICED: dict[int, tuple[Parameter, Parameter]] = {}


def reslice(leaf: nn.Cell, name: str, axis: int, group: Group, what: str) -> None:
    plan = plan_of(leaf)
    if plan is not None and plan.fsdp is not None:
        raise ParallelConfigError(f"{what}: apply tensor parallelism before fully_shard")
    param = getattr(leaf, name)
    full_shape = tuple(param.shape)
    hit = _RESLICED.get(id(param))
    if hit is not None and hit[0] is param:
        new = hit[1]
    else:
        data = param.asnumpy()
        if data.ndim <= axis or data.shape[axis] % group.size:
            raise ParallelConfigError(
                f"{what}: {name} of shape {list(data.shape)} cannot be split {group.size} ways along axis {axis}; "
                f"choose a tensor_parallel that divides {data.shape[axis] if data.ndim > axis else 'it'}")
        width = data.shape[axis] // group.size
        mine = np.take(data, range(group.rank * width, (group.rank + 1) * width), axis=axis)
        new = Parameter(Tensor(np.ascontiguousarray(mine), dtype=param.dtype), name=param.name,
                        requires_grad=param.requires_grad)
        _RESLICED[id(param)] = (param, new)
    setattr(leaf, name, new)
    ensure_plan(leaf).tp_shards[name] = TPShard(axis=axis, size=group.size, index=group.rank, full_shape=full_shape)


def _sync_replicated(leaf: nn.Cell, names, group: Group) -> None:
    plan = ensure_plan(leaf)
    for name in names:
        if name in plan.names and name not in plan.grad_sync:
            plan.grad_sync[name] = CopyToGroup(group)


class ParallelStyle(ABC):
    """A transform of one sub-Cell for the tensor-parallel group."""

    @abstractmethod
    def apply(self, cell: nn.Cell, group: Group, path: str) -> None:
        """Shard `cell` (found at `path` in the model) over `group`, in place."""


class ColwiseParallel(ParallelStyle):
    """Linear with W [out, in] split along out. Output: feature-sharded ("shard") or all-gathered
    along the last axis ("replicate", backward keeps the own slice).

    `regather_input` (input "shard_seq" only; recompute_comm): the all-gathered input is not kept
    for the weight gradient; backward gathers the sequence shard again. Saves the full-sequence
    input's bytes per leaf, costs one more all-gather in backward."""

    def __init__(self, input_layout: str = "replicate", output_layout: str = "shard", seq_axis: int = 1,
                 regather_input: bool = False) -> None:
        self.input_layout = _check(input_layout, _INPUTS, "ColwiseParallel.input_layout")
        self.output_layout = _check(output_layout, ("shard", "replicate"), "ColwiseParallel.output_layout")
        self.seq_axis = seq_axis
        if regather_input and self.input_layout != "shard_seq":
            raise ParallelConfigError(f"ColwiseParallel.regather_input: needs input_layout 'shard_seq' (the input it "
                                      f"all-gathers), got {self.input_layout!r}")
        self.regather_input = regather_input

    def apply(self, cell, group, path):
        if group.size == 1:
            return
        what = f"ColwiseParallel({path})"
        reslice(cell, "weight", 0, group, what)
        if getattr(cell, "bias", None) is not None:
            reslice(cell, "bias", 0, group, what)
        plan = ensure_plan(cell)
        if self.input_layout == "shard_seq":
            plan.input_transform = GatherFromGroup(group, self.seq_axis)
            plan.regather_input = self.regather_input
        elif self.input_layout == "replicate":
            plan.input_transform = CopyToGroup(group)
        if self.output_layout == "replicate":
            plan.output_transform = GatherSplit(group, -1)
        install(cell)


class RowwiseParallel(ParallelStyle):
    """Linear with W [out, in] split along in (input feature-sharded). Output: reduce-scattered to
    sequence shards ("shard_seq", the SP default) or all-reduced ("replicate")."""

    def __init__(self, output_layout: str = "shard_seq", seq_axis: int = 1) -> None:
        self.output_layout = _check(output_layout, ("shard_seq", "replicate"), "RowwiseParallel.output_layout")
        self.seq_axis = seq_axis

    def apply(self, cell, group, path):
        if group.size == 1:
            return
        reslice(cell, "weight", 1, group, f"RowwiseParallel({path})")
        plan = ensure_plan(cell)
        if self.output_layout == "shard_seq":
            plan.output_transform = ReduceScatterToGroup(group, self.seq_axis)
        else:
            plan.output_transform = ReduceFromGroup(group)
        if "bias" in plan.names:
            plan.deferred = ("bias",)
            if self.output_layout == "shard_seq":
                _sync_replicated(cell, ("bias",), group)
        install(cell)


def vocab_parallel_embedding_forward(cell, table, ids):
    """Rows of this rank's vocabulary slice; ids outside it give zero rows (summed across tp)."""
    local = ids - cell.mf_vocab_offset
    # Primitives throughout: under FSDP reshard-after-forward this runs inside a GRAPH_MODE bprop.
    inside = ops.LogicalAnd()(local >= 0, local < table.shape[0])
    rows = ops.Gather()(table, ops.Select()(inside, local, ops.ZerosLike()(local)), 0)
    return rows * ops.ExpandDims()(ops.Cast()(inside, rows.dtype), -1)


class VocabParallelEmbedding(ParallelStyle):
    """Embedding table split along the vocabulary; partial lookups are summed across tp and, with
    SP, scattered along the sequence ("shard_seq") or all-reduced ("replicate")."""

    def __init__(self, output_layout: str = "shard_seq", seq_axis: int = 1) -> None:
        self.output_layout = _check(output_layout, ("shard_seq", "replicate"), "VocabParallelEmbedding.output_layout")
        self.seq_axis = seq_axis

    def apply(self, cell, group, path):
        if group.size == 1:
            return
        plan = ensure_plan(cell)
        if len(plan.names) != 1:
            raise ParallelConfigError(f"VocabParallelEmbedding({path}): expects one table parameter, got {plan.names}")
        name = plan.names[0]
        reslice(cell, name, 0, group, f"VocabParallelEmbedding({path})")
        cell.mf_vocab_start = group.rank * getattr(cell, name).shape[0]
        # The offset enters the graph as data: a rank-dependent constant (0 on rank 0 folds away)
        # would give ranks differently shaped graphs, which issue their collectives in different orders.
        cell.mf_vocab_offset = Tensor(cell.mf_vocab_start, ms.int32)
        plan.fn = vocab_parallel_embedding_forward
        plan.output_transform = (ReduceScatterToGroup(group, self.seq_axis) if self.output_layout == "shard_seq"
                                 else ReduceFromGroup(group))
        install(cell)


class SequenceParallel(ParallelStyle):
    """A leaf (norm) that runs on sequence shards with replicated parameters: its parameter
    gradients are partial per shard, so they are all-reduced over tp."""

    def apply(self, cell, group, path):
        if group.size == 1:
            return
        plan = ensure_plan(cell)
        _sync_replicated(cell, plan.names, group)
        install(cell)


def _prepared_construct(self, x, *rest):
    return self._mf_base.construct(self, self.mf_prepare_input(x), *rest)


class PrepareModuleInput(ParallelStyle):
    """Convert a (non-leaf) module's first input: "shard_seq" -> all-gathered full sequence, whose
    backward reduce-scatters the summed gradients of every consumer inside the module."""

    def __init__(self, input_layout: str = "shard_seq", desired_layout: str = "gathered", seq_axis: int = 1) -> None:
        if (input_layout, desired_layout) != ("shard_seq", "gathered"):
            raise ParallelConfigError(
                f"PrepareModuleInput: only shard_seq -> gathered is implemented, got {input_layout} -> {desired_layout}")
        self.seq_axis = seq_axis

    def apply(self, cell, group, path):
        if group.size == 1:
            return
        if "mf_prepare_input" in cell._cells:
            raise ParallelConfigError(f"PrepareModuleInput({path}): applied twice")
        base = type(cell)
        cell.__class__ = type(f"Prepared{base.__name__}", (base,), {"construct": _prepared_construct,
                                                                    "_mf_base": base})
        cell.mf_prepare_input = GatherFromGroup(group, self.seq_axis)


def parallelize_module(module: nn.Cell, tp_group: Group, plan: Mapping[str, ParallelStyle]) -> nn.Cell:
    """Apply each style to the sub-Cell at its dotted path ("" is `module` itself). In place.

    Paths are applied in the mapping's order; a path that names no sub-Cell is an error (a typo
    in a plan must not silently leave a layer unsharded). Apply before fully_shard and before the
    first call in GRAPH_MODE.
    """
    cells = dict(module.cells_and_names())
    for path, style in plan.items():
        if path not in cells:
            near = [p for p in cells if p.rsplit(".", 1)[-1] == path.rsplit(".", 1)[-1]][:3]
            raise ParallelConfigError(f"parallelize_module: no sub-Cell at {path!r}" +
                                      (f" (did you mean {', '.join(near)}?)" if near else ""))
        if not isinstance(style, ParallelStyle):
            raise ParallelConfigError(f"parallelize_module: {path!r} maps to {style!r}, not a ParallelStyle")
        style.apply(cells[path], tp_group, path)
    return module


def local_heads(num_heads: int, tp: int) -> int:
    """Attention heads per tensor-parallel rank (tp must divide num_heads)."""
    if num_heads % tp:
        raise ParallelConfigError(f"parallelism.tensor_parallel: {tp} does not divide {num_heads} heads")
    return num_heads // tp
