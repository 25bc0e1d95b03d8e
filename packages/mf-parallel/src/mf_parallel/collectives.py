"""Collectives that work on every backend: native primitives where the backend has them, an exact
emulation from AllReduce where it does not (see `backend.CAPABILITIES`).

Every collective is a Cell whose choice of path is made once, in `__init__`, from the group and
the capability table, so `construct` contains only tensor code and compiles in GRAPH_MODE. The
emulations only ever add a rank's values to zeros, which is exact in floating point (x + 0 = x, and
inf/nan stay in their own slot), so emulated and native results are bitwise identical:

- all_gather(x)        all_reduce of a buffer of `group size` slots, own slot = x, others zero
- reduce_scatter(x)    all_reduce(x), then keep this rank's slice
- all_to_all(x)        all_reduce of a [src, dst] slot matrix, own row = x's chunks; keep column
- all_to_all_v(x)      the same with every chunk zero-padded to the largest one any rank sends
                       another (known to all ranks from the counts exchanged first), own chunk kept
- broadcast(x, src)    all_reduce of x on the source, zeros elsewhere
- send/recv            all_reduce in the two-rank group {src, dst}, zeros from the receiver

- all_reduce max/min/prod (MCCL sums only): the emulated all-gather, then the reduction locally

Dtypes the backend cannot all-reduce (MCCL: anything but float32/float16) travel through an exact
float32 encoding (`transport.py`). Uneven sizes (`sizes=` per rank along the axis) are padded to
the largest and trimmed back.
Each call is reported to `stats.comm_stats()`; the first emulated use of each kind is logged.
Groups of one rank make every collective the identity (nothing is counted).
"""

from __future__ import annotations

import logging

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mf_parallel.backend import CAPABILITIES, REDUCE_OPS, is_native, native_reduce_op
from mf_parallel.errors import ParallelConfigError
from mf_parallel.mesh import Group, init_distributed, make_group
from mf_parallel.stats import count_code, counted, make_count_op
from mf_parallel.transport import MAX_RANKS, decode, encode, needs_transport

log = logging.getLogger("mf_parallel")
_LOGGED: set[str] = set()
# Counted kinds that are not rows of the capability table: the variable all-to-all is native where
# the backend has both the all-to-all and a variable one (MindSpore's AlltoAllV: Ascend only).
_CAPABILITY_OF = {"all_to_all_v": "all_to_all"}
_VARIABLE_NATIVE = ("hccl",)


def note_emulation(kind: str, group: Group) -> None:
    if kind not in _LOGGED:
        _LOGGED.add(kind)
        where = CAPABILITIES[group.backend][_CAPABILITY_OF.get(kind, kind)].value
        log.info("%s is emulated with an exact all_reduce(sum) on %s (first use: group %s, %d ranks; native "
                 "support: %s)", kind, group.backend, group.label, group.size, where)


# Data movement is written with primitives: functional wrappers such as ops.narrow, ops.pad and
# ops.zeros_like run Python-side checks that fail to compile inside a GRAPH_MODE bprop on 2.10.0
# ("The func graph is empty ... check_value_type" / "... zeros_like").
def slice_axis(x, axis: int, start: int, length: int):
    """x's slice [start, start + length) along `axis`."""
    begin = (0,) * axis + (start,) + (0,) * (x.ndim - axis - 1)
    size = x.shape[:axis] + (length,) + x.shape[axis + 1:]
    return ops.Slice()(x, begin, size)


def take_slot(x, axis: int, n: int, rank):
    """Slot `rank` of `x` cut evenly into `n` along `axis`. `rank` is a 0-d int32 Tensor - data, not
    a constant - so every rank compiles the same graph (see `CollectiveOp.slot_mask`)."""
    chunk = x.shape[axis] // n
    return ops.Gather()(x.reshape(x.shape[:axis] + (n, chunk) + x.shape[axis + 1:]), rank, axis)


def pad_axis(x, axis: int, before: int, after: int):
    """Zero-pad `x` along `axis` with `before` / `after` slices."""
    parts = ()
    if before > 0:
        parts = parts + (ops.Zeros()(x.shape[:axis] + (before,) + x.shape[axis + 1:], x.dtype),)
    parts = parts + (x,)
    if after > 0:
        parts = parts + (ops.Zeros()(x.shape[:axis] + (after,) + x.shape[axis + 1:], x.dtype),)
    return ops.Concat(axis)(parts)


def _check_sizes(sizes, n: int, what: str):
    if sizes is None:
        return None
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != n or any(s < 0 for s in sizes):
        raise ParallelConfigError(f"{what}: sizes must list one non-negative size per rank ({n}), got {list(sizes)}")
    return sizes


class CollectiveOp(nn.Cell):
    """Common state: group geometry, native-or-emulated decision and the counting op."""

    kind = ""

    def __init__(self, group: Group, native: bool | None = None) -> None:
        super().__init__()
        self.n = group.size
        self.r = group.rank
        self.group_label = group.label
        if native is None:
            native = True if group.size == 1 else is_native(self.kind, group.backend, group.is_world)
        self.native = native
        self.code = count_code(self.kind, not self.native)
        self.transport = needs_transport(group.backend)
        if self.transport and group.size >= MAX_RANKS:
            raise ParallelConfigError(f"{self.kind} on group {group.label}: the exact float32 transport of "
                                      f"{group.backend} supports fewer than {MAX_RANKS} ranks, got {group.size}")
        if group.size > 1:
            self.count_op = make_count_op()
            self.sum_prim = ops.AllReduce("sum", group.name)
            # Which slot is this rank's, as data rather than as rank-dependent padding: ranks then
            # compile graphs of the same structure, which a compiled step needs to issue its
            # collectives in the same order on every rank (see backend.graph_mode_blocker).
            self.slot_mask = ms.Tensor(np.arange(group.size) == group.rank)
            self.rank_t = ms.Tensor(group.rank, ms.int32)
            if not self.native:
                note_emulation(self.kind, group)

    def _count(self, out, payload, issued, code=None):
        """Report one call; applied to the primitive's *output*, so if the compiler merges two
        identical collectives their records merge with them, and otherwise they stay apart."""
        return counted(out, self.count_op, self.code if code is None else code, payload, issued)

    def _sum(self, x, payload):
        """All-reduce (sum) of any dtype, through the exact float transport where needed; counted."""
        if self.transport:
            enc = encode(x)
            out = self._count(self.sum_prim(enc), payload, enc.itemsize * enc.size)
            return decode(out, x.dtype)
        return self._count(self.sum_prim(x), payload, x.itemsize * x.size)

    def _slots(self, x, payload, code=None):
        """[group size, *x.shape]: every rank's x, as an all-reduce of zeros with this rank's slot filled."""
        enc = encode(x) if self.transport else x
        shape = (self.n,) + enc.shape
        spread = ops.BroadcastTo(shape)(enc.reshape((1,) + enc.shape))
        mask = ops.BroadcastTo(shape)(self.slot_mask.reshape((self.n,) + (1,) * enc.ndim))
        buf = ops.Select()(mask, spread, ops.ZerosLike()(spread))  # a select: exact, inf/nan stay put
        out = self._count(self.sum_prim(buf), payload, buf.itemsize * buf.size, code)
        return decode(out, x.dtype) if self.transport else out


class AllReduce(CollectiveOp):
    """Sum (or max/min/prod) over the group; every rank gets the result."""

    kind = "all_reduce"

    def __init__(self, group: Group, op: str = "sum") -> None:
        if op not in REDUCE_OPS:
            raise ParallelConfigError(f"all_reduce: op must be one of {REDUCE_OPS}, got {op!r}")
        native = None if group.size == 1 or op == "sum" else native_reduce_op(op, group.backend)
        super().__init__(group, native)
        self.op = op
        if group.size > 1 and op != "sum" and self.native:
            self.op_prim = ops.AllReduce(op, group.name)

    def construct(self, x):
        if self.n == 1:
            return x
        nbytes = x.itemsize * x.size
        if self.op == "sum":
            return self._sum(x, nbytes)
        if self.native:
            return self._count(self.op_prim(x), nbytes, nbytes)
        slots = self._slots(x, nbytes)
        if self.op == "max":
            return slots.max(axis=0)
        if self.op == "min":
            return slots.min(axis=0)
        return ops.ReduceProd()(slots, 0)


class AllGather(CollectiveOp):
    """Concatenate every rank's `x` along `axis` in group-rank order.

    `sizes` (one per rank) allows uneven extents along `axis`; without it all are equal.
    """

    kind = "all_gather"

    def __init__(self, group: Group, axis: int = 0, sizes=None) -> None:
        super().__init__(group)
        self.axis = axis
        sizes = _check_sizes(sizes, group.size, "all_gather")
        # Every attribute exists whatever the case: a GRAPH_MODE bprop parses untaken branches too.
        self.even = sizes is None or len(set(sizes)) == 1
        self.sizes = sizes or ()
        self.max_size = max(sizes) if sizes else 0
        if group.size > 1 and self.native:
            self.prim = ops.AllGather(group.name)

    def construct(self, x):
        if self.n == 1:
            return x
        axis = self.axis if self.axis >= 0 else self.axis + x.ndim
        padded = x
        if not self.even:
            padded = pad_axis(x, axis, 0, self.max_size - x.shape[axis])
        out = self._gather0(padded, x.itemsize * x.size)     # [n * rows, ...]: slots along dim 0
        if self.even and axis == 0:
            return out
        slots = ops.Split(0, self.n)(out)
        if self.even:
            return ops.Concat(axis)(slots)
        return self._trim_cat(slots, axis)

    def _trim_cat(self, slots, axis):
        pieces = ()
        for i in range(self.n):
            pieces = pieces + (slice_axis(slots[i], axis, 0, self.sizes[i]),)
        return ops.Concat(axis)(pieces)


    def _gather0(self, x, payload):
        if self.native:
            return self._count(self.prim(x), payload, x.itemsize * x.size)
        out = self._slots(x, payload)
        return out.reshape((self.n * x.shape[0],) + x.shape[1:])


class ReduceScatter(CollectiveOp):
    """Sum over the group, then keep this rank's slice along `axis` (`sizes` for uneven slices)."""

    kind = "reduce_scatter"

    def __init__(self, group: Group, axis: int = 0, sizes=None) -> None:
        super().__init__(group)
        self.axis = axis
        sizes = _check_sizes(sizes, group.size, "reduce_scatter")
        self.even = sizes is None or len(set(sizes)) == 1
        self.uneven = sizes is not None      # explicit sizes (possibly all equal)
        self.sizes = sizes or ()
        self.offset = sum(sizes[: group.rank]) if sizes else 0
        self.own = sizes[group.rank] if sizes else 0
        # Uneven slices differ in shape per rank anyway; their indices still travel as data.
        self.own_index = ms.Tensor(np.arange(self.offset, self.offset + self.own, dtype=np.int32))
        self.max_size = max(sizes) if sizes else 0
        if group.size > 1 and self.native:
            self.prim = ops.ReduceScatter("sum", group.name)

    def construct(self, x):
        if self.n == 1:
            return x
        axis = self.axis if self.axis >= 0 else self.axis + x.ndim
        nbytes = x.itemsize * x.size
        if not self.native:
            total = self._sum(x, nbytes)
            if self.uneven:
                return ops.Gather()(total, self.own_index, axis)
            return take_slot(total, axis, self.n, self.rank_t)
        if self.even and axis == 0:
            return self._count(self.prim(x), nbytes, nbytes)
        return self._native_any(x, axis, nbytes)

    def _native_any(self, x, axis, nbytes):
        """The primitive splits dim 0 evenly: move the (padded) slices along `axis` there first."""
        if self.uneven:
            chunks = ops.SplitV(self.sizes, axis, self.n)(x)
        else:
            chunks = ops.Split(axis, self.n)(x)
        stacked = ()
        for i in range(self.n):
            chunk = chunks[i]
            if not self.even:
                chunk = pad_axis(chunk, axis, 0, self.max_size - self.sizes[i])
            stacked = stacked + (chunk,)
        buf = ops.Concat(0)(stacked)
        mine = self._count(self.prim(buf), nbytes, buf.itemsize * buf.size)
        if self.even:
            return mine
        return slice_axis(mine, axis, 0, self.own)


class AllToAll(CollectiveOp):
    """Split `x` into group-size chunks along `split_axis`, send chunk j to rank j, and concatenate
    what arrives along `concat_axis` in source-rank order."""

    kind = "all_to_all"

    def __init__(self, group: Group, split_axis: int = 0, concat_axis: int = 0) -> None:
        super().__init__(group)
        self.split_axis = split_axis
        self.concat_axis = concat_axis
        if group.size > 1 and self.native:
            self.prim = ops.AlltoAll(group.size, split_axis, concat_axis, group.name)

    def construct(self, x):
        if self.n == 1:
            return x
        nbytes = x.itemsize * x.size
        if self.native:
            return self._count(self.prim(x), nbytes, nbytes)
        chunks = ops.Split(self.split_axis, self.n)(x)
        full = self._slots(ops.Stack(0)(chunks), nbytes)              # [src, dst, *chunk]
        pieces = ()
        for src in range(self.n):
            pieces = pieces + (full[src][self.r],)
        return ops.Concat(self.concat_axis)(pieces)


class AllToAllV(CollectiveOp):
    """Variable-size all-to-all along dim 0, counts first. PyNative only: the sizes are data, read
    on the host (a compiled step keeps static buffers; see expert_parallel.py).

    `exchange_counts(counts)`: counts [P, ...] int numpy, row j = what this rank will send rank j;
    returns (received [P, ...], row s = what rank s will send here, pad). One fixed-size all-to-all
    of int32 (counted as `all_to_all`). Emulated, that all-to-all is an all-reduce of every rank's
    counts, so each rank also learns `pad`, the largest chunk (`rows_of` summed over the row) any
    rank sends another: the height every rank pads its chunks to, since an all-reduce needs one
    shape on every rank. Natively `pad` is 0 (unused).
    `construct(x, send, recv, pad)`: x [sum(send), ...] in destination-rank order, chunk j (send[j]
    rows) to rank j; returns [sum(recv), ...] in source-rank order. Own chunk stays local.
    Counted as `all_to_all_v`: payload = the rows sent to *other* ranks (what crosses a link),
    issued = the padded slot matrix emulated, the whole buffer natively.
    """

    kind = "all_to_all_v"

    def __init__(self, group: Group) -> None:
        native = True if group.size == 1 else (group.backend in _VARIABLE_NATIVE
                                               and is_native("all_to_all", group.backend, group.is_world))
        super().__init__(group, native)
        self.counts_code = count_code("all_to_all", not self.native)
        if group.size > 1 and self.native:
            self.counts_prim = ops.AlltoAll(group.size, 0, 0, group.name)
            self.prim = ops.AlltoAllV(group.name)

    def exchange_counts(self, counts):
        counts = np.asarray(counts, np.int32)
        if self.n == 1:
            return counts, 0
        sent = ms.Tensor(counts)
        others = int(counts.size - counts[self.r].size) * 4       # the rows for the other ranks
        if self.native:
            return self._count(self.counts_prim(sent), others, counts.size * 4, self.counts_code).asnumpy(), 0
        full = self._slots(sent, others, self.counts_code).asnumpy()                # [src, dst, ...]
        rows = full.reshape(self.n, self.n, -1).sum(2)
        off = rows[~np.eye(self.n, dtype=bool)]
        return full[:, self.r], int(off.max()) if off.size else 0

    def construct(self, x, send, recv, pad):
        if self.n == 1:
            return x
        row = x.shape[1:]
        row_bytes = x.itemsize * int(np.prod(row, dtype=np.int64))
        payload = (sum(send) - send[self.r]) * row_bytes
        if self.native:
            numel = int(np.prod(row, dtype=np.int64))
            out = self.prim(x.reshape(-1), [s * numel for s in send], [r * numel for r in recv])
            return self._count(out, payload, x.itemsize * x.size).reshape((sum(recv),) + row)
        offsets = np.concatenate(([0], np.cumsum(send)))
        own = slice_axis(x, 0, int(offsets[self.r]), send[self.r])
        if pad == 0:                        # nothing crosses between any two ranks this time
            return own
        chunks = ()
        for j in range(self.n):
            if j == self.r or send[j] == 0:
                chunk = ops.Zeros()((pad,) + row, x.dtype)
            else:
                chunk = pad_axis(slice_axis(x, 0, int(offsets[j]), send[j]), 0, 0, pad - send[j])
            chunks = chunks + (chunk,)
        full = self._slots(ops.Stack(0)(chunks), payload)              # [src, dst, pad, ...]
        pieces = ()
        for src in range(self.n):
            if src == self.r:
                pieces = pieces + (own,)
            elif recv[src]:
                pieces = pieces + (slice_axis(full[src][self.r], 0, 0, recv[src]),)
        return ops.Concat(0)(pieces) if len(pieces) > 1 else pieces[0]


class Broadcast(CollectiveOp):
    """Every rank gets the `src` rank's `x` (`src` is a group rank; all ranks pass a same-shaped x)."""

    kind = "broadcast"

    def __init__(self, group: Group, src: int = 0) -> None:
        if not 0 <= src < group.size:
            raise ParallelConfigError(f"broadcast: src {src} is not a rank of group {group.label} (size {group.size})")
        super().__init__(group)
        self.src = src
        if group.size > 1 and self.native:
            self.prim = ops.Broadcast(src, group.name)
        self.is_src = ms.Tensor(group.rank == src)    # data, not a branch: same graph on every rank

    def construct(self, x):
        if self.n == 1:
            return x
        nbytes = x.itemsize * x.size
        if self.native:
            return self._count(self.prim((x,))[0], nbytes, nbytes)
        contribution = ops.Select()(ops.BroadcastTo(x.shape)(self.is_src), x, ops.ZerosLike()(x))
        return self._sum(contribution, nbytes)


class SendRecv(CollectiveOp):
    """Point-to-point: world rank `src` sends a tensor of `shape`/`dtype` to world rank `dst`.

    Both ranks build this Cell (it creates the two-rank group) and call it at the same point: the
    sender passes the tensor and gets it back, the receiver passes nothing and gets the message.
    """

    kind = "send_recv"

    def __init__(self, src: int, dst: int, shape, dtype=ms.float32, tag: int = 0) -> None:
        rank, _ = init_distributed()
        if src == dst or rank not in (src, dst):
            raise ParallelConfigError(f"send_recv: rank {rank} must be exactly one of src {src} / dst {dst}")
        group = make_group("p2p", sorted((src, dst)))
        super().__init__(group)
        self.is_src = rank == src
        self.shape = tuple(shape)
        self.dtype = dtype
        if self.native:
            peer = group.ranks.index(dst if self.is_src else src)
            if self.is_src:
                self.prim = ops.Send(tag, peer, group=group.name)
            else:
                self.prim = ops.Receive(tag, peer, list(self.shape), dtype, group=group.name)

    def construct(self, x=None):
        if self.is_src:
            payload = x
        else:
            payload = ops.Zeros()(self.shape, self.dtype)
        nbytes = payload.itemsize * payload.size
        if self.native:
            if self.is_src:
                return ops.depend(x, self._count(self.prim(x), nbytes, nbytes))
            return self._count(self.prim(payload), nbytes, nbytes)
        return self._sum(payload, nbytes)


# ----------------------------------------------------------------------------- eager helpers
_CELLS: dict[tuple, nn.Cell] = {}


def _cached(cls, group: Group, *args) -> nn.Cell:
    key = (cls, group, args)
    cell = _CELLS.get(key)
    if cell is None:
        cell = _CELLS[key] = cls(group, *args)
    return cell


def all_reduce(x, group: Group, op: str = "sum"):
    return _cached(AllReduce, group, op)(x)


def all_gather(x, group: Group, axis: int = 0, sizes=None):
    return _cached(AllGather, group, axis, None if sizes is None else tuple(sizes))(x)


def reduce_scatter(x, group: Group, axis: int = 0, sizes=None):
    return _cached(ReduceScatter, group, axis, None if sizes is None else tuple(sizes))(x)


def all_to_all(x, group: Group, split_axis: int = 0, concat_axis: int = 0):
    return _cached(AllToAll, group, split_axis, concat_axis)(x)


def broadcast(x, group: Group, src: int = 0):
    return _cached(Broadcast, group, src)(x)


def send_recv(x, src: int, dst: int, shape, dtype=ms.float32, tag: int = 0):
    key = (SendRecv, src, dst, tuple(shape), dtype, tag)
    cell = _CELLS.get(key)
    if cell is None:
        cell = _CELLS[key] = SendRecv(src, dst, shape, dtype, tag)
    return cell(x)


def barrier(group: Group) -> None:
    """Block until every member arrives (an all-reduce of one int that is synchronised on)."""
    if group.size > 1:
        all_reduce(ms.Tensor([1], ms.int32), group).asnumpy()
