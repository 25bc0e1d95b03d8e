"""The counts-first, variable-size exchange of the expert-parallel dispatchers (PyNative).

`VariableExchange`: rows along dim 0 to the ranks of a group, chunk j (send[j] rows) to rank j,
with per-rank sizes known from a counts exchange made first (`AllToAllV.exchange_counts`). Its
adjoint is the same exchange with send and receive sizes swapped, so gradients return along the
routes the rows took. The sizes travel as an int32 Tensor input [3, P] (send, recv, pad), so the
backward reads the sizes of its own call (a layer may be called again before its backward runs,
e.g. under recomputation).

`ExpertRoute`: a set of assignments (row of `x`, destination rank, expert index at that rank)
sent to the ranks owning their experts: the per-(destination, local expert) counts first, then the
rows sorted by destination and expert, so the receiver knows every received row's expert from the
counts alone (no ids travel). Its `combine` brings each assignment's output row back by the
reverse exchange, in the assignments' own order.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mf_parallel.collectives import AllToAllV
from mf_parallel.mesh import Group


def _sizes(sizes) -> tuple[list[int], list[int], int]:
    send, recv, pad = sizes.asnumpy().tolist()
    return send, recv, pad[0]


def size_tensor(send, recv, pad: int):
    """The [3, P] int32 sizes input of `VariableExchange` (pad repeated along the row)."""
    return ms.Tensor(np.stack([np.asarray(send), np.asarray(recv), np.full(len(send), pad)]).astype(np.int32))


class VariableExchange(nn.Cell):
    """`AllToAllV` of rows, its own adjoint with the sizes swapped (see the module docstring)."""

    def __init__(self, group: Group) -> None:
        super().__init__()
        self.forward_a2a = AllToAllV(group)
        self.backward_a2a = AllToAllV(group)

    def construct(self, x, sizes):
        send, recv, pad = _sizes(sizes)
        return self.forward_a2a(x, send, recv, pad)

    def bprop(self, x, sizes, out, dout):
        send, recv, pad = _sizes(sizes)
        return self.backward_a2a(dout, recv, send, pad), ops.zeros_like(sizes)


class ExpertRoute(nn.Cell):
    """Assignments to the experts of the ranks of `group` (`local_experts` per rank), laid out for
    the receiving rank's experts by `local`, a one-rank dispatcher for `local_experts` (+1) experts
    and top-1. PyNative: the sizes come from the routing."""

    def __init__(self, group: Group, local_experts: int, local: nn.Cell) -> None:
        super().__init__()
        self.p = group.size
        self.local_experts = local_experts
        self.local = local
        self.counts = AllToAllV(group)
        self.exchange = VariableExchange(group)
        self.reverse = VariableExchange(group)

    def dispatch(self, x, row, dest, expert):
        """x [T, H]; row, dest, expert: int numpy [A] (an assignment's row of x, destination rank
        in the group, expert index there). -> (rows [nb*b, H], block_expert [nb], handle, received
        assignments R)."""
        le, p = self.local_experts, self.p
        key = dest * le + expert
        order = np.argsort(key, kind="stable")
        send_counts = np.bincount(key, minlength=p * le).reshape(p, le)
        recv_counts, pad = self.counts.exchange_counts(send_counts)            # [P, le]: per source, per expert
        send, recv = send_counts.sum(1), recv_counts.sum(1)
        sent = ops.gather(x, ms.Tensor(row[order].astype(np.int32)), 0)
        received = self.exchange(sent, size_tensor(send, recv, pad))             # [R, H], source-major, by expert
        local_id = np.repeat(np.tile(np.arange(le), p), recv_counts.reshape(-1)).astype(np.int32)
        r = int(recv.sum())
        if r == 0:          # nothing for this rank's experts: one zero row keeps the layout non-empty
            received = ops.zeros((1, x.shape[1]), x.dtype)
            local_id = np.zeros(1, np.int32)
        rows, block_expert, dest_rows, _, _ = self.local.dispatch(received, ms.Tensor(local_id.reshape(-1, 1)))
        block_expert = ops.minimum(block_expert, le - 1)
        inverse = np.empty_like(order)
        inverse[order] = np.arange(order.size)
        handle = (dest_rows[:r] if r else dest_rows[:0], size_tensor(recv, send, pad),
                  ms.Tensor(inverse.astype(np.int32)))
        return rows, block_expert, handle, r

    def combine(self, expert_rows, handle):
        """expert_rows [nb*b, H] -> every assignment's output [A, H] (float32), in dispatch order."""
        dest_rows, back_sizes, inverse = handle
        out = ops.gather(expert_rows, dest_rows, 0).astype(ms.float32)          # [R, H]
        back = self.reverse(out, back_sizes)                                     # [A, H], sorted order
        return ops.gather(back, inverse, 0)
