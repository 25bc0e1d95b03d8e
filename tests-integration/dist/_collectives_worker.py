"""Every collective on every group shape of a 4-rank 2x2 layout (world, tp, dp_shard), checked
against numpy on the known inputs of all ranks; autograd pairs in PyNative and GRAPH_MODE; the
communication counter; the emulation log; and the MCCL capability table itself (what it says is
missing must still fail, what it says works must work). One RESULT line per check and rank."""

from __future__ import annotations

import logging
import os

import mindspore as ms
import numpy as np
from _results import emit, run_check
from mindspore import Tensor, nn, ops

import mf_parallel as mp

ms.set_context(mode=ms.PYNATIVE_MODE)
records: list[str] = []


class _Capture(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())


logging.getLogger("mf_parallel").addHandler(_Capture())
logging.getLogger("mf_parallel").setLevel(logging.INFO)

dims = mp.ParallelDims(4, dp_shard=2, tp=2)
mesh = mp.init_mesh(dims)
RANK = mesh.rank
GROUPS = {"world": mesh["world"], "tp": mesh["tp"], "dp_shard": mesh["dp_shard"]}


def base(rank: int, shape, dtype=np.float32) -> np.ndarray:
    return (np.arange(int(np.prod(shape))).reshape(shape) + 100 * rank + 1).astype(dtype)


def same(got, want) -> tuple[bool, str]:
    got = np.asarray(got)
    ok = got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got, want)
    return ok, "" if ok else f"got {got.dtype}{list(got.shape)} {got.ravel()[:8]}, want {want.dtype}{list(want.shape)} {want.ravel()[:8]}"


# ----------------------------------------------------------------------------- plain collectives
def check_all_reduce(g, dtype, op):
    members = g.ranks
    signed = lambda r: base(r, (3, 4)) * (1 if r % 2 else -1)  # noqa: E731
    if dtype == "bool":
        inputs = {r: (base(r, (3, 4)) % (r + 2) == 0) for r in members}
        want = np.logical_or.reduce([inputs[r] for r in members])
        got = mp.all_reduce(Tensor(inputs[RANK]), g).asnumpy()
        return same(got, want)
    np_dtype = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64}[dtype]
    inputs = {r: signed(r).astype(np_dtype) for r in members}
    if dtype == "int64":
        inputs = {r: v * np.int64(3_000_000_000) for r, v in inputs.items()}   # beyond int32 and 2^24
    stack = np.stack([inputs[r] for r in members])
    want = {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0), "prod": stack.prod(0)}[op].astype(np_dtype)
    got = mp.all_reduce(Tensor(inputs[RANK]), g, op).asnumpy()
    return same(got, want)


def _bf16(a: np.ndarray) -> np.ndarray:
    """Round float32 values to bfloat16 and back (MindSpore's own rounding)."""
    return Tensor(a.astype(np.float32), ms.bfloat16).float().asnumpy()


def check_all_reduce_bf16(g):
    """bf16 travels as float32: the sum of the bf16 inputs, accumulated in float32, rounded once."""
    inputs = {r: _bf16(base(r, (5,)) / 4) for r in g.ranks}
    want = _bf16(np.sum([inputs[r] for r in g.ranks], 0))
    got = mp.all_reduce(Tensor(inputs[RANK], ms.bfloat16), g).float().asnumpy()
    return same(got, want)


def check_all_gather(g, axis, uneven, dtype=np.float32):
    sizes = [i + 1 for i in range(g.size)] if uneven else [2] * g.size
    shape = lambda i: (sizes[i], 3) if axis == 0 else (3, sizes[i])  # noqa: E731
    inputs = {r: base(r, shape(i), dtype) for i, r in enumerate(g.ranks)}
    want = np.concatenate([inputs[r] for r in g.ranks], axis)
    got = mp.all_gather(Tensor(inputs[RANK]), g, axis, sizes if uneven else None).asnumpy()
    return same(got, want)


def check_reduce_scatter(g, axis, uneven):
    sizes = [i + 1 for i in range(g.size)] if uneven else [2] * g.size
    total = sum(sizes)
    shape = (total, 3) if axis == 0 else (3, total)
    inputs = {r: base(r, shape) for r in g.ranks}
    summed = np.sum([inputs[r] for r in g.ranks], 0)
    start = sum(sizes[: g.rank])
    want = np.take(summed, range(start, start + sizes[g.rank]), axis=axis)
    got = mp.reduce_scatter(Tensor(inputs[RANK]), g, axis, sizes if uneven else None).asnumpy()
    return same(got, want)


def check_all_to_all(g, split_axis, concat_axis):
    n = g.size
    shape = (2 * n, 3) if split_axis == 0 else (3, 2 * n)
    inputs = {r: base(r, shape) for r in g.ranks}
    pieces = [np.split(inputs[src], n, split_axis)[g.rank] for src in g.ranks]
    want = np.concatenate(pieces, concat_axis)
    got = mp.all_to_all(Tensor(inputs[RANK]), g, split_axis, concat_axis).asnumpy()
    return same(got, want)


def check_all_to_all_v(g, pattern):
    """Counts first, then variable sizes: the sizes (some zero; "local": only to itself, so no
    chunk crosses and nothing is all-reduced) known to every rank; received chunks in source
    order, the counts' column and the pad, and the bytes sent to other ranks counted."""
    n, me = g.size, g.rank
    rows = np.array([[(3 * s + d) % 4 if pattern == "uneven" else (s + 1) * (s == d) for d in range(n)]
                     for s in range(n)])
    inputs = {s: base(r, (int(rows[s].sum()), 3)) for s, r in enumerate(g.ranks)}
    starts = {s: np.concatenate(([0], np.cumsum(rows[s]))) for s in range(n)}
    want = np.concatenate([inputs[s][starts[s][me]:starts[s][me + 1]] for s in range(n)])
    cell = mp.AllToAllV(g)
    recv, pad = cell.exchange_counts(rows[me].reshape(n, 1))
    off = rows[~np.eye(n, dtype=bool)]
    if recv.reshape(n).tolist() != rows[:, me].tolist() or pad != off.max():
        return False, f"counts {recv.reshape(n).tolist()} pad {pad}, want {rows[:, me].tolist()} {off.max()}"
    mp.comm_stats().reset()
    got = cell(Tensor(inputs[me]), rows[me].tolist(), rows[:, me].tolist(), pad).asnumpy()
    moved = mp.comm_stats().snapshot().get("all_to_all_v/emulated", {}).get("payload_bytes", 0)
    sent = (int(rows[me].sum()) - int(rows[me, me])) * 3 * 4
    ok, detail = same(got, want)
    return ok and moved == sent, f"{detail} bytes {moved} vs {sent}"


def check_broadcast(g, src):
    inputs = {r: base(r, (2, 3)) for r in g.ranks}
    got = mp.broadcast(Tensor(inputs[RANK]), g, src).asnumpy()
    return same(got, inputs[g.ranks[src]])


def check_send_recv(pairs, shape):
    for src, dst in pairs:
        if RANK in (src, dst):
            payload = Tensor(base(src, shape)) if RANK == src else None
            got = mp.send_recv(payload, src, dst, shape).asnumpy()
            return same(got, base(src, shape))
    return False, "rank in no pair"


def check_barrier(g):
    mp.barrier(g)
    return True, ""


def check_communicator():
    out = []
    for g in (mesh["world"], mesh["tp"]):
        comm = mp.Communicator(g)
        obj = {"rank": RANK, "blob": "x" * (17 * (RANK + 1)), "arr": np.arange(RANK + 2)}
        got = comm.all_gather_object(obj)
        want_ranks = list(g.ranks)
        ok = ([o["rank"] for o in got] == want_ranks and all(len(o["blob"]) == 17 * (r + 1) for o, r in zip(got, want_ranks))
              and all(np.array_equal(o["arr"], np.arange(r + 2)) for o, r in zip(got, want_ranks)))
        comm.barrier()
        out.append(ok and comm.rank == g.rank and comm.world_size == g.size)
    return all(out), f"{out}"


def check_native_equals_emulated():
    """World-group gather/broadcast are native on MCCL; forced emulation must give the same bits."""
    g = mesh["world"]
    x = Tensor(base(RANK, (2, 3)) / 7)
    native = (mp.AllGather(g, 1)(x).asnumpy(), mp.Broadcast(g, 2)(x).asnumpy())
    os.environ["MF_PARALLEL_EMULATE"] = "all_gather,broadcast"
    try:
        cells = (mp.AllGather(g, 1), mp.Broadcast(g, 2))
        emulated = (cells[0](x).asnumpy(), cells[1](x).asnumpy())
        flags = (cells[0].native, cells[1].native)
    finally:
        del os.environ["MF_PARALLEL_EMULATE"]
    ok = flags == (False, False) and all(np.array_equal(a, b) for a, b in zip(native, emulated))
    return ok, f"emulated flags {flags}"


def check_counter():
    """Exact per-kind volumes on the tp group (2 ranks, emulated gather/scatter)."""
    g = mesh["tp"]
    stats = mp.comm_stats()
    stats.reset()
    mp.all_gather(Tensor(base(RANK, (2, 3))), g)                 # payload 24 B, issued 2 x 24
    mp.reduce_scatter(Tensor(base(RANK, (4, 3))), g)             # payload 48 B, issued 48
    mp.all_reduce(Tensor(base(RANK, (3,))), g).asnumpy()         # 12 / 12
    mp.all_reduce(Tensor(base(RANK, (3,), np.int32)), g).asnumpy()  # 12 B payload, 2 float channels: 24
    snap = stats.snapshot()
    want = {"all_gather/emulated": {"calls": 1, "payload_bytes": 24, "issued_bytes": 48},
            "reduce_scatter/emulated": {"calls": 1, "payload_bytes": 48, "issued_bytes": 48},
            "all_reduce/native": {"calls": 2, "payload_bytes": 24, "issued_bytes": 36}}
    stats.reset()
    return snap == want, f"{snap}"


# ----------------------------------------------------------------------------- autograd pairs
class Probe(nn.Cell):
    """loss = sum(cell(x) * w): w differs per rank, so upstream gradients are rank-specific."""

    def __init__(self, cell, w):
        super().__init__()
        self.cell = cell
        self.w = Tensor(w)

    def construct(self, x):
        return (self.cell(x) * self.w).sum()


def check_autograd(name):
    g = mesh["tp"]
    n, i = g.size, g.rank
    xs = {r: base(r, (2, 2, 3)) for r in g.ranks}
    rep = base(0, (2, 4, 3))                          # a replicated input (same on every rank)
    sl = slice(2 * i, 2 * i + 2)
    cat = lambda d: np.concatenate([d[r] for r in g.ranks], 1)  # noqa: E731
    if name == "CopyToGroup":
        cell, x, ws = mp.CopyToGroup(g), xs[RANK], {r: base(r, (2, 2, 3)) * 0.5 for r in g.ranks}
        fwd, dx = xs[RANK], sum(ws.values())
    elif name == "ReduceFromGroup":
        cell, x, ws = mp.ReduceFromGroup(g), xs[RANK], {r: base(r, (2, 2, 3)) * 0.5 for r in g.ranks}
        fwd, dx = sum(xs.values()), ws[RANK]
    elif name == "GatherFromGroup":
        cell, x, ws = mp.GatherFromGroup(g, 1), xs[RANK], {r: base(r, (2, 2 * n, 3)) * 0.5 for r in g.ranks}
        fwd, dx = cat(xs), sum(ws.values())[:, sl]
    elif name == "ReduceScatterToGroup":
        cell, x, ws = mp.ReduceScatterToGroup(g, 1), base(RANK, (2, 4, 3)), {r: base(r, (2, 2, 3)) * 0.5 for r in g.ranks}
        fwd, dx = sum(base(r, (2, 4, 3)) for r in g.ranks)[:, sl], cat(ws)
    elif name == "SplitToGroup":
        cell, x, ws = mp.SplitToGroup(g, 1), rep, {r: base(r, (2, 2, 3)) * 0.5 for r in g.ranks}
        fwd, dx = rep[:, sl], cat(ws)
    else:  # GatherSplit
        cell, x, ws = mp.GatherSplit(g, 1), xs[RANK], {r: base(r, (2, 2 * n, 3)) * 0.5 for r in g.ranks}
        fwd, dx = cat(xs), ws[RANK][:, sl]
    got_fwd = cell(Tensor(x)).asnumpy()
    got_dx = ms.grad(Probe(cell, ws[RANK]))(Tensor(x)).asnumpy()
    ok1, d1 = same(got_fwd, fwd.astype(np.float32))
    ok2, d2 = same(got_dx, dx.astype(np.float32))
    return ok1 and ok2, f"forward {d1} backward {d2}"


# ----------------------------------------------------------------------------- the capability table
def check_capability(kind):
    """MCCL primitives the table marks unsupported must fail; those it marks working must work."""
    world, tp = mesh["world"].name, mesh["tp"].name
    x = Tensor(base(RANK, (4, 3)))

    def fails(fn):
        try:
            fn().asnumpy()
        except Exception as exc:  # the failure is the expected outcome
            return True, f"fails as recorded: {str(exc).strip().splitlines()[-1][:160]}"
        return False, "the primitive now works: update backend.CAPABILITIES and the README"

    table = mp.CAPABILITIES["mccl"]
    if kind == "all_reduce":
        ok = table[kind] is mp.Support.ANY
        ops.AllReduce("sum", tp)(x).asnumpy()
        bad = [fails(lambda op=op: ops.AllReduce(op, world)(x))[0] for op in ("max", "min", "prod")]
        bad.append(fails(lambda: ops.AllReduce("sum", tp)(Tensor(np.ones(3, np.int32))))[0])
        return ok and all(bad), "sum works on a sub-group; max/min/prod and int32 fail"
    if kind in ("all_gather", "broadcast"):
        prim = (lambda g: ops.AllGather(g)) if kind == "all_gather" else (lambda g: (lambda t: ops.Broadcast(0, g)((t,))[0]))
        prim(world)(x).asnumpy()
        ok, detail = fails(lambda: prim(tp)(x))
        return ok and table[kind] is mp.Support.WORLD, detail
    if kind == "reduce_scatter":
        ok, detail = fails(lambda: ops.ReduceScatter("sum", world)(x))
    elif kind == "all_to_all":
        ok, detail = fails(lambda: ops.AlltoAll(4, 0, 0, world)(x))
    else:
        ok, detail = fails(lambda: ops.Send(0, (RANK + 1) % 4, group=world)(x))
    return ok and table[kind] is mp.Support.NONE, detail


def run_all():
    """Every check except the capability probes (which run kernels that must fail: run them last)."""
    for gname, g in GROUPS.items():
        for dtype in ("float32", "float16", "int32", "int64"):
            run_check(f"all_reduce[{gname}-{dtype}-sum]", check_all_reduce, g, dtype, "sum")
        run_check(f"all_reduce[{gname}-bool-sum]", check_all_reduce, g, "bool", "sum")
        run_check(f"all_reduce[{gname}-bfloat16-sum]", check_all_reduce_bf16, g)
        for op in ("max", "min", "prod"):
            run_check(f"all_reduce[{gname}-float32-{op}]", check_all_reduce, g, "float32", op)
        run_check(f"all_reduce[{gname}-int32-max]", check_all_reduce, g, "int32", "max")
        for axis in (0, 1):
            for uneven in (False, True):
                run_check(f"all_gather[{gname}-axis{axis}-{'uneven' if uneven else 'even'}]",
                          check_all_gather, g, axis, uneven)
                run_check(f"reduce_scatter[{gname}-axis{axis}-{'uneven' if uneven else 'even'}]",
                          check_reduce_scatter, g, axis, uneven)
        run_check(f"all_gather[{gname}-int32]", check_all_gather, g, 0, True, np.int32)
        run_check(f"all_to_all[{gname}-split0-concat1]", check_all_to_all, g, 0, 1)
        run_check(f"all_to_all[{gname}-split1-concat0]", check_all_to_all, g, 1, 0)
        for src in (0, 1):
            run_check(f"broadcast[{gname}-src{src}]", check_broadcast, g, src)
        run_check(f"barrier[{gname}]", check_barrier, g)
    run_check("send_recv[0->1,2->3]", check_send_recv, [(0, 1), (2, 3)], (2, 3))
    run_check("send_recv[1->0,3->2]", check_send_recv, [(1, 0), (3, 2)], (3,))
    run_check("send_recv[0->2,1->3]", check_send_recv, [(0, 2), (1, 3)], (1, 4))
    run_check("communicator", check_communicator)
    run_check("native_equals_emulated", check_native_equals_emulated)
    run_check("counter[pynative]", check_counter)
    for name in ("CopyToGroup", "ReduceFromGroup", "GatherFromGroup", "ReduceScatterToGroup", "SplitToGroup",
                 "GatherSplit"):
        run_check(f"autograd[{name}-pynative]", check_autograd, name)
    emulated = sorted({m.split(" ", 1)[0] for m in records if "is emulated" in m})
    counts = {k: sum(1 for m in records if m.startswith(k + " is emulated")) for k in emulated}
    emit("emulation_logged_once", emulated == ["all_gather", "all_reduce", "all_to_all", "broadcast",
                                               "reduce_scatter", "send_recv"] and set(counts.values()) == {1},
         f"{counts}")
    for gname, g in GROUPS.items():         # after the log check: all_to_all_v logs its own first use
        for pattern in ("uneven", "local"):
            run_check(f"all_to_all_v[{gname}-{pattern}]", check_all_to_all_v, g, pattern)

    ms.set_context(mode=ms.GRAPH_MODE)
    for name in ("GatherFromGroup", "ReduceScatterToGroup", "CopyToGroup", "ReduceFromGroup"):
        run_check(f"autograd[{name}-graph]", check_autograd, name)
    run_check("counter[graph]", check_counter)
    ms.set_context(mode=ms.PYNATIVE_MODE)


def run_capabilities():
    for kind in mp.CAPABILITIES["mccl"]:
        run_check(f"capability[{kind}]", check_capability, kind)


if __name__ == "__main__":
    run_all()
    run_capabilities()
    emit("done", True)
