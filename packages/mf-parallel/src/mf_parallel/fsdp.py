"""FSDP / HSDP, ZeRO-3 style: `fully_shard(cell, mesh, ...)`.

Every parameter under `cell` (not already sharded by an inner `fully_shard`) is replaced by its
dim-0 shard over the "dp_shard_cp" group: dim 0 is padded with zeros to a multiple of the group
size and each rank keeps one equal chunk. Before each use the leaf all-gathers its full parameter;
in backward the full-parameter gradient is cast to `reduce_dtype` (float32), reduce-scattered
over the shard group, all-reduced over "dp_replicate" (HSDP), optionally divided by the data
parallel size, and cast back. The zero padding stays zero: its gradient is zero.

Apply tensor parallelism first: FSDP then shards each rank's TP-local tensor (FSDP2 x TP2).
"""

from __future__ import annotations

import itertools
import logging
import math
from dataclasses import dataclass, field

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from mf_parallel.collectives import AllGather, AllReduce, ReduceScatter, pad_axis, slice_axis
from mf_parallel.errors import ParallelConfigError
from mf_parallel.layout import reshard_after_forward_for  # noqa: F401 (the policy is the layout's)
from mf_parallel.leaf import ensure_plan, install, plan_of
from mf_parallel.mesh import DeviceMesh, Group

log = logging.getLogger("mf_parallel")


def check_cpu_offload(cpu_offload: bool, device_target: str | None = None) -> None:
    """`cpu_offload` is rejected with the reason: it cannot be honoured here."""
    if not isinstance(cpu_offload, bool):
        raise ParallelConfigError(f"parallelism.cpu_offload: must be true or false, got {cpu_offload!r}")
    if not cpu_offload:
        return
    device = device_target or ms.get_context("device_target")
    if device == "CPU":
        raise ParallelConfigError(
            "parallelism.cpu_offload: means nothing on device_target CPU (parameters and optimizer states already "
            "live in host memory); set it to false")
    raise ParallelConfigError(
        f"parallelism.cpu_offload: not supported by mf-parallel on {device} yet (no host-offloaded parameter or "
        f"optimizer path is implemented); set it to false")


@dataclass
class FSDPShard:
    """One parameter's dim-0 sharding (shape is the pre-FSDP, i.e. TP-local, shape).

    0-d parameters cannot be split: they stay whole on every rank (`replicated`) and only their
    gradient is reduced over the shard and replica groups.
    """

    shape: tuple[int, ...]
    chunk: int      # rows per rank (the last ranks may hold only padding)
    size: int       # shard group size
    index: int      # this rank's position in the shard group

    @property
    def replicated(self) -> bool:
        return len(self.shape) == 0

    @property
    def pad(self) -> int:
        return 0 if self.replicated else self.chunk * self.size - self.shape[0]

    @property
    def valid_rows(self) -> tuple[int, int]:
        """(start, count) of real rows of the pre-FSDP tensor held by this rank."""
        start = min(self.index * self.chunk, self.shape[0])
        return start, max(0, min(self.chunk, self.shape[0] - start))


@dataclass
class FSDPParams:
    """The FSDP settings of one leaf (read by `leaf.LeafCore`)."""

    shard_group: Group
    replicate_group: Group
    reshard_after_forward: bool
    reduce_dtype: object
    divide_by: int
    unit: int = 0   # which `fully_shard` call owns the leaf (gather prefetch works unit by unit)
    shards: dict[str, FSDPShard] = field(default_factory=dict)
    defer_replicas: bool = False    # the replica all-reduce left to the step (grad_sync.defer_gradient_syncs)

    def passes_param(self, name: str) -> bool:
        """Whether the gather of `name` returns its input unchanged (nothing to gather)."""
        return self.shard_group.size == 1 or self.shards[name].replicated

    def make_gather(self, leaf: nn.Cell, name: str) -> nn.Cell:
        spec = self.shards[name]
        param = getattr(leaf, name)
        return ShardGather(self.shard_group, self.replicate_group, spec, self.reduce_dtype, self.divide_by,
                           param.dtype, self.defer_replicas)


class ShardGather(nn.Cell):
    """Forward: all-gather the dim-0 shards and drop the padding. Backward: pad, cast to the reduce
    dtype, reduce-scatter over the shard group, all-reduce over the replicas, divide, cast back.

    `regather` is the backward's gather of a resharded leaf: the same collective through its own
    Cell (`regather_op`), so a prefetcher can tell the forward's gathers from the backward's."""

    def __init__(self, shard_group: Group, replicate_group: Group, spec: FSDPShard, reduce_dtype, divide_by: int,
                 param_dtype, defer_replicas: bool = False) -> None:
        super().__init__()
        self.replicated = spec.replicated
        self.dim0 = 0 if spec.replicated else spec.shape[0]
        self.pad = spec.pad
        if self.replicated:
            self.shard_reduce = AllReduce(shard_group)
        else:
            self.gather = AllGather(shard_group, 0)
            self.regather_op = AllGather(shard_group, 0)
            self.scatter = ReduceScatter(shard_group, 0)
        self.replicas = AllReduce(replicate_group)
        self.cast = reduce_dtype != param_dtype
        self.reduce_dtype = reduce_dtype
        self.divide_by = divide_by
        # The replica all-reduce left to the step, bucketed with the others (grad_sync): only where
        # the gradient stays in the reduce dtype (nothing to sum in a narrower one).
        self.defer_replicas = bool(defer_replicas) and not self.replicated and not self.cast

    def construct(self, shard):
        if self.replicated:
            return shard
        return self._unpad(self.gather(shard))

    def regather(self, shard):
        if self.replicated:
            return shard
        return self._unpad(self.regather_op(shard))

    def _unpad(self, full):
        if self.pad > 0:
            full = slice_axis(full, 0, 0, self.dim0)
        return full

    def backward(self, shard, dout):
        grad = dout
        if self.pad > 0:
            grad = pad_axis(grad, 0, 0, self.pad)
        if self.cast:
            grad = ops.Cast()(grad, self.reduce_dtype)
        if self.replicated:
            grad = self.replicas(self.shard_reduce(grad))
        elif self.defer_replicas:
            grad = self.scatter(grad)
        else:
            grad = self.replicas(self.scatter(grad))
        if self.divide_by > 1:
            grad = grad / self.divide_by
        if self.cast:
            grad = ops.Cast()(grad, shard.dtype)
        return grad

    def bprop(self, shard, out, dout):
        return (self.backward(shard, dout),)


# Parameters shared by several leaves (tied embeddings) are sharded once: id(original) -> shard.
_SHARDED: dict[int, tuple[Parameter, Parameter, FSDPShard]] = {}


def _shard_parameter(param: Parameter, group: Group) -> tuple[Parameter, FSDPShard]:
    hit = _SHARDED.get(id(param))
    if hit is not None and hit[0] is param:
        return hit[1], hit[2]
    data = param.asnumpy()
    shape = tuple(data.shape)
    if not shape:
        spec = FSDPShard(shape=shape, chunk=0, size=group.size, index=group.rank)
        _SHARDED[id(param)] = (param, param, spec)
        return param, spec
    rows = data
    chunk = math.ceil(rows.shape[0] / group.size)
    padded = np.zeros((chunk * group.size,) + rows.shape[1:], dtype=rows.dtype)
    padded[: rows.shape[0]] = rows
    mine = padded[group.rank * chunk:(group.rank + 1) * chunk]
    new = Parameter(Tensor(mine.copy(), dtype=param.dtype), name=param.name, requires_grad=param.requires_grad)
    spec = FSDPShard(shape=shape, chunk=chunk, size=group.size, index=group.rank)
    _SHARDED[id(param)] = (param, new, spec)
    return new, spec


SHARD_GROUPS = ("dp_shard_cp", "dp_shard_mod_ep")
_UNITS = itertools.count(1)


def fully_shard(cell: nn.Cell, mesh: DeviceMesh, *, reshard_after_forward: bool = True,
                disable_gradient_division: bool = True, reduce_dtype=ms.float32, cpu_offload: bool = False,
                group: str = "dp_shard_cp") -> nn.Cell:
    """Shard every parameter under `cell` not yet sharded (apply to inner units first, root last).

    disable_gradient_division=True sums gradients over the data-parallel ranks (the loss is
    normalised by the global token count); False divides them by dp_replicate x dp_shard x cp.
    `group` is the shard group: "dp_shard_cp" (every data-parallel rank of the layout), or for
    expert weights split over ep, "dp_shard_mod_ep" (the ranks holding the same experts;
    `shard_experts` uses it). The division, when on, is by the whole data-parallel size either way.
    Returns `cell` (changed in place). Apply before the first call in GRAPH_MODE.
    """
    if not isinstance(reshard_after_forward, bool):
        raise ParallelConfigError(f"fully_shard: reshard_after_forward must be a bool, got {reshard_after_forward!r} "
                                  f"(resolve a policy string with reshard_after_forward_for)")
    if not isinstance(disable_gradient_division, bool):
        raise ParallelConfigError(
            f"parallelism.disable_gradient_division: must be true or false, got {disable_gradient_division!r}")
    check_cpu_offload(cpu_offload)
    if group not in SHARD_GROUPS:
        raise ParallelConfigError(f"fully_shard: group must be one of {', '.join(SHARD_GROUPS)}, got {group!r}")
    shard_group, replicate_group = mesh[group], mesh["dp_replicate"]
    divide_by = 1 if disable_gradient_division else mesh["dp_shard_cp"].size * replicate_group.size
    count = 0
    unit = next(_UNITS)
    leaves = [leaf for _, leaf in cell.cells_and_names() if any(p is not None for p in leaf._params.values())]
    for leaf in leaves:
        existing = plan_of(leaf)
        if existing is not None and existing.fsdp is not None:
            continue  # an inner unit owns it
        plan = ensure_plan(leaf)
        fsdp = FSDPParams(shard_group, replicate_group, reshard_after_forward, reduce_dtype, divide_by, unit)
        for name in plan.names:
            new, spec = _shard_parameter(getattr(leaf, name), shard_group)
            setattr(leaf, name, new)
            fsdp.shards[name] = spec
            count += 1
        plan.fsdp = fsdp
        install(leaf)
    log.debug("fully_shard(%s): %d parameters over %s x %s, reshard_after_forward=%s", type(cell).__name__, count,
              shard_group.label, replicate_group.label, reshard_after_forward)
    return cell
