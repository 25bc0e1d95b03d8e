"""One `Comm` of a schedule: tensors each way between two pipeline ranks, in one rendezvous.

Native backends (HCCL, NCCL): one Send / Receive per message, in the Comm's canonical message
order on both ranks, so the two sides pair up in order (not measured here: no Ascend machine).
MCCL (CPU) has no Send/Receive: the emulation is one all-reduce (sum) over the two-rank group of
a float32 buffer holding every message of the Comm, each at its own offset, zeros where the
other rank's messages go; each rank reads back what it receives. That is mf-parallel's
`send_recv` emulation generalised to several messages each way, and exact the same way (values
are only added to zeros; bfloat16 and float16 are exact in float32). Measured on 2.10.0: it
blocks both ranks until both arrive, and an op issued after it on the same rank waits for it too.
"""

from __future__ import annotations

import math

import mindspore as ms
from mindspore import Tensor, ops

from mf_parallel.backend import is_native
from mf_parallel.collectives import CollectiveOp
from mf_parallel.errors import ParallelConfigError
from mf_parallel.mesh import make_group

_CAST, _FLAT, _ZEROS, _CONCAT = ops.Cast(), ops.Reshape(), ops.Zeros(), ops.Concat(0)


class PairChannel(CollectiveOp):
    """The exchange between this rank and `peer` (world ranks); counted as `send_recv`."""

    kind = "send_recv"

    def __init__(self, me: int, peer: int) -> None:
        if me == peer:
            raise ParallelConfigError(f"pipeline p2p: rank {me} cannot exchange with itself")
        group = make_group("pp_p2p", sorted((me, peer)))
        super().__init__(group, native=is_native("send_recv", group.backend, group.is_world))
        self.me, self.peer = me, peer
        self.peer_in_group = group.ranks.index(peer)
        self.group_name = group.name
        self._native_ops: dict[tuple, object] = {}

    def exchange(self, sends: list[tuple[object, Tensor]], recvs: list[tuple[object, tuple, object]],
                 order: list[object]) -> dict[object, Tensor]:
        """Send `sends` [(key, tensor)], receive `recvs` [(key, shape, dtype)]; `order` lists every
        key of the Comm in the order both ranks agree on. Returns {key: received tensor}."""
        if self.native:
            return self._native(sends, recvs, order)
        sent = dict(sends)
        shapes = {k: tuple(t.shape) for k, t in sends}
        shapes.update({k: tuple(shape) for k, shape, _ in recvs})
        parts, offsets, total = [], {}, 0
        for k in order:
            size = math.prod(shapes[k])
            offsets[k] = total
            total += size
            t = sent.get(k)
            parts.append(_FLAT(_CAST(t, ms.float32), (-1,)) if t is not None else _ZEROS((size,), ms.float32))
        buffer = _CONCAT(tuple(parts)) if len(parts) > 1 else parts[0]
        payload = sum(t.itemsize * t.size for t in sent.values())
        summed = self._count(self.sum_prim(buffer), payload, buffer.itemsize * buffer.size)
        out = {}
        for k, shape, dtype in recvs:
            start = offsets[k]
            piece = summed[start:start + math.prod(shape)].reshape(shape)
            out[k] = piece if dtype == ms.float32 else _CAST(piece, dtype)
        return out

    def _native(self, sends, recvs, order):
        sent = dict(sends)
        wanted = {k: (shape, dtype) for k, shape, dtype in recvs}
        out = {}
        for tag, k in enumerate(order):
            if k in sent:
                t = sent[k]
                op = self._native_op("send", tag, tuple(t.shape), t.dtype)
                self._count(op(t), t.itemsize * t.size, t.itemsize * t.size)
            else:
                shape, dtype = wanted[k]
                op = self._native_op("recv", tag, shape, dtype)
                got = op(ops.zeros(shape, dtype))
                out[k] = self._count(got, got.itemsize * got.size, got.itemsize * got.size)
        return out

    def _native_op(self, kind: str, tag: int, shape: tuple, dtype):
        key = (kind, tag, shape, dtype)
        op = self._native_ops.get(key)
        if op is None:
            if kind == "send":
                op = ops.Send(tag, self.peer_in_group, group=self.group_name)
            else:
                op = ops.Receive(tag, self.peer_in_group, list(shape), dtype, group=self.group_name)
            self._native_ops[key] = op
        return op
