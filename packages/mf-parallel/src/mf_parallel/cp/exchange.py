"""The ring shift: every rank of a group sends a tensor to the next rank and receives the previous
rank's (group-rank order, wrapping round), one point-to-point message each way.

Where the backend has Send/Receive (HCCL, NCCL) those are used. Where it does not (MCCL on CPU),
each message is mf-parallel's send_recv emulation: an all-reduce over the two-rank group {sender,
receiver} to which the receiver adds zeros (exact). That was the cheapest exact form measured on
2.10.0 CPU ranks (median of 5, a loaded 2-core machine):

    ring of 4, 0.5 MB / 4.2 MB: two pair all-reduces 189 / 453 ms; world all-gather, keep the
    previous rank's slot 207 / 616 ms; one all-reduce of a 4-slot buffer 558 / 1592 ms
    ring of 2, 0.5 MB / 4.2 MB: 29 / 163 ms; 27 / 118 ms; 90 / 263 ms

The all-gather form is native only on the world group (MCCL), the slot all-reduce moves cp times
the payload; the pair all-reduces work on any sub-group at ~ twice the payload.

Blocking messages must pair up: even group ranks send first and then receive, odd ones receive
first, which completes for any ring size (the odd ranks' first receive matches an even rank's
first send; a ring of odd size ends with rank 0 receiving from the last, even, rank). The second
message is made to depend on the first's result, so a compiled graph keeps that order too. The
two-rank groups are created in one global order (every edge of the ring in turn), because group
creation is collective among the members.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import nn, ops

from mf_parallel.backend import is_native
from mf_parallel.collectives import note_emulation
from mf_parallel.mesh import Group, make_group
from mf_parallel.stats import count_code, counted, make_count_op
from mf_parallel.transport import decode, encode, needs_transport


class RingExchange(nn.Cell):
    """`exchange(x)` -> the previous group rank's `x` (every rank passes a same-shaped tensor)."""

    kind = "send_recv"

    def __init__(self, group: Group, tag: int = 0) -> None:
        super().__init__()
        self.n = group.size
        self.r = group.rank
        self.send_first = group.rank % 2 == 0
        # Every attribute exists whatever the path: graph mode parses untaken branches too.
        self.native = True
        self.transport = False
        self.code = 0
        self.tag = tag
        self.recv_src = (self.r - 1) % self.n
        self.group_name = group.name
        self.nothing = ms.Tensor(False)
        if self.n == 1:
            return
        ranks = group.ranks
        me = group.world_rank
        nxt, prv = ranks[(self.r + 1) % self.n], ranks[(self.r - 1) % self.n]
        self.native = is_native(self.kind, group.backend, group.is_world)
        self.code = count_code(self.kind, not self.native)
        self.count_op = make_count_op()
        self.transport = needs_transport(group.backend)
        if self.native:
            self.send = ops.Send(tag, (self.r + 1) % self.n, group=group.name)
            self.to_next = self.from_prev = None
            return
        for i in range(self.n):                  # every ring edge, in the same order on every rank
            edge = (ranks[i], ranks[(i + 1) % self.n])
            if me in edge:
                make_group("cp_ring_pair", sorted(edge))
        to_next = make_group("cp_ring_pair", sorted((me, nxt)))
        from_prev = make_group("cp_ring_pair", sorted((prv, me)))
        self.to_next = ops.AllReduce("sum", to_next.name)
        self.from_prev = ops.AllReduce("sum", from_prev.name)
        self.send = None
        note_emulation(self.kind, to_next)

    def zeros_from(self, x):
        """Zeros shaped like x, selected from x by a mask held as data. Plain zeros of a known shape
        fold into a constant in a compiled graph, and the compiler then merged two receives of equal
        shape into one all-reduce (the ranks then issued different numbers of collectives and MCCL
        failed: "Ring ReduceScatter wait receiving ... failed"; seen on 2.10.0)."""
        return ops.Select()(ops.BroadcastTo(x.shape)(self.nothing), x, ops.ZerosLike()(x))

    def construct(self, x):
        if self.n == 1:
            return x
        nbytes = x.itemsize * x.size
        if self.native:
            return self._native(x, nbytes)
        payload = encode(x) if self.transport else x
        issued = payload.itemsize * payload.size
        if self.send_first:
            sent = self.to_next(payload)
            got = self.from_prev(ops.depend(self.zeros_from(payload), sent))
        else:
            got = self.from_prev(self.zeros_from(payload))
            sent = self.to_next(ops.depend(payload, got))
        got = ops.depend(got, sent)
        got = counted(got, self.count_op, self.code, nbytes, 2 * issued)
        return decode(got, x.dtype) if self.transport else got

    def _native(self, x, nbytes):
        # Receive needs the message's shape, which is the caller's (every rank sends the same shape).
        receive = ops.Receive(self.tag, self.recv_src, list(x.shape), x.dtype, group=self.group_name)
        if self.send_first:
            sent = self.send(x)
            got = receive(ops.depend(self.zeros_from(x), sent))
        else:
            got = receive(self.zeros_from(x))
            sent = self.send(ops.depend(x, got))
        return counted(ops.depend(got, sent), self.count_op, self.code, nbytes, 2 * nbytes)
