"""Autograd-aware collectives: Cells whose custom `bprop` is the adjoint of their forward.

The pairs (forward <-> backward) and where the strategies use them:

  CopyToGroup          identity       <-> all_reduce       input of a column-parallel layer without
                                                           SP; replicated params used on sharded data
  ReduceFromGroup      all_reduce     <-> identity         output of a row-parallel layer without SP;
                                                           vocab-parallel loss partial sums
  GatherFromGroup      all_gather     <-> reduce_scatter   SP: sequence-sharded -> full sequence
  ReduceScatterToGroup reduce_scatter <-> all_gather       SP: row-parallel output -> sequence shards
  SplitToGroup         own slice      <-> all_gather       replicated -> sharded (values identical)
  GatherSplit          all_gather     <-> own slice        sharded -> replicated, when the consumer's
                                                           gradient is the same on every rank

Each also exposes `backward(x, dout)`, so a recomputing bprop (FSDP reshard-after-forward) can
apply the adjoint without running the forward collective again. All are graph-compatible (the first parameter is `self`; collectives are sub-Cells) and were
checked in PyNative and GRAPH_MODE on CPU ranks (tests-integration/dist).
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn

from mf_parallel.collectives import AllGather, AllReduce, ReduceScatter, take_slot
from mf_parallel.mesh import Group


class CopyToGroup(nn.Cell):
    """Forward: identity. Backward: all-reduce (sum) the gradient over the group."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.reduce = AllReduce(group)
        object.__setattr__(self, "group", group)      # for grad_sync.defer_gradient_syncs

    def construct(self, x):
        return x

    def backward(self, x, dout):
        return self.reduce(dout)

    def bprop(self, x, out, dout):
        return (self.backward(x, dout),)


class ReduceFromGroup(nn.Cell):
    """Forward: all-reduce (sum). Backward: identity."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.reduce = AllReduce(group)

    def construct(self, x):
        return self.reduce(x)

    def backward(self, x, dout):
        return dout

    def bprop(self, x, out, dout):
        return (dout,)


class _GatherScatter(nn.Cell):
    """The group's all-gather and reduce-scatter along `axis`: one is the forward, the other the
    backward (`construct` / `backward` of the subclass)."""

    def __init__(self, group: Group, axis: int) -> None:
        super().__init__()
        self.gather = AllGather(group, axis)
        self.scatter = ReduceScatter(group, axis)

    def bprop(self, x, out, dout):
        return (self.backward(x, dout),)


class GatherFromGroup(_GatherScatter):
    """Forward: all-gather along `axis`. Backward: reduce-scatter the (partial) gradient along `axis`."""

    def construct(self, x):
        return self.gather(x)

    def backward(self, x, dout):
        return self.scatter(dout)


class ReduceScatterToGroup(_GatherScatter):
    """Forward: reduce-scatter along `axis`. Backward: all-gather along `axis`."""

    def construct(self, x):
        return self.scatter(x)

    def backward(self, x, dout):
        return self.gather(dout)


class _GatherSlot(nn.Cell):
    """The group's all-gather along `axis` and this rank's slot of a tensor (no communication): one
    is the forward, the other the backward."""

    def __init__(self, group: Group, axis: int) -> None:
        super().__init__()
        self.n = group.size
        self.rank = ms.Tensor(group.rank, ms.int32)
        self.axis = axis
        self.gather = AllGather(group, axis)

    def slot(self, x):
        if self.n == 1:
            return x
        return take_slot(x, self.axis % x.ndim, self.n, self.rank)

    def bprop(self, x, out, dout):
        return (self.backward(x, dout),)


class SplitToGroup(_GatherSlot):
    """Forward: keep this rank's slice along `axis` (no communication). Backward: all-gather."""

    def construct(self, x):
        return self.slot(x)

    def backward(self, x, dout):
        return self.gather(dout)


class GatherSplit(_GatherSlot):
    """Forward: all-gather along `axis`. Backward: keep this rank's slice of the gradient."""

    def construct(self, x):
        return self.gather(x)

    def backward(self, x, dout):
        return self.slot(dout)
