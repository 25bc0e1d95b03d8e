"""World size 1: every collective is the identity and costs nothing; argument errors; the backend
table; the exact float transport; the communication counter (in PyNative and GRAPH_MODE)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

import mf_parallel as mp
from mf_parallel.backend import backend_name, forced_emulation, is_native, native_reduce_op
from mf_parallel.stats import count_code, counted, make_count_op
from mf_parallel.transport import decode, encode


@pytest.fixture(scope="module")
def mesh():
    return mp.init_mesh(mp.ParallelDims(1))


@pytest.fixture(autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_single_rank_world_and_groups(mesh):
    assert mp.init_distributed() == (0, 1)
    for name in mp.GROUP_NAMES + ("world",):
        g = mesh[name]
        assert g.size == 1 and g.rank == 0 and g.name == ""


def test_collectives_are_identity_and_uncounted(mesh):
    g = mesh["tp"]
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    mp.comm_stats().reset()
    outs = [mp.all_reduce(x, g), mp.all_reduce(x, g, "max"), mp.all_gather(x, g, 1), mp.all_gather(x, g, 0, [3]),
            mp.reduce_scatter(x, g, 1), mp.all_to_all(x, g, 0, 1), mp.broadcast(x, g, 0)]
    for out in outs:
        np.testing.assert_array_equal(out.asnumpy(), x.asnumpy())
    mp.barrier(g)
    assert mp.comm_stats().snapshot() == {}


def test_argument_errors(mesh):
    g = mesh["tp"]
    with pytest.raises(mp.ParallelConfigError, match="all_reduce: op must be one of"):
        mp.AllReduce(g, "mean")
    with pytest.raises(mp.ParallelConfigError, match=r"all_gather: sizes must list one non-negative size per rank \(1\)"):
        mp.AllGather(g, 0, [1, 2])
    with pytest.raises(mp.ParallelConfigError, match="broadcast: src 1 is not a rank of group tp"):
        mp.Broadcast(g, 1)
    with pytest.raises(mp.ParallelConfigError, match=r"group p2p: ranks \[0, 1\] must be distinct ranks of the world"):
        mp.SendRecv(0, 1, (2,))
    with pytest.raises(mp.ParallelConfigError, match="must be exactly one of src"):
        mp.SendRecv(0, 0, (2,))
    with pytest.raises(mp.ParallelConfigError, match="unknown group 'tensor'"):
        mesh["tensor"]


def test_mesh_rejects_a_layout_for_another_world():
    with pytest.raises(mp.ParallelConfigError, match="the layout is for 2 ranks but 1 were started; launch with -n 2"):
        mp.DeviceMesh(mp.ParallelDims(2, tp=2))


# ----------------------------------------------------------------------------- backend table
def test_capability_table_is_the_measured_one():
    mccl = mp.CAPABILITIES["mccl"]
    assert mccl["all_reduce"] is mp.Support.ANY
    assert mccl["all_gather"] is mccl["broadcast"] is mp.Support.WORLD
    assert mccl["reduce_scatter"] is mccl["all_to_all"] is mccl["send_recv"] is mp.Support.NONE
    assert all(s is mp.Support.ANY for s in mp.CAPABILITIES["hccl"].values())
    table = mp.capability_table()
    assert "| all_gather | world group only | any group | any group |" in table
    assert "| all_reduce ops | sum | sum, max, min, prod | sum, max, min, prod |" in table


def test_native_decisions(monkeypatch):
    assert is_native("all_gather", "mccl", is_world=True)
    assert not is_native("all_gather", "mccl", is_world=False)
    assert not is_native("reduce_scatter", "mccl", is_world=True)
    assert is_native("reduce_scatter", "hccl", is_world=False)
    assert not native_reduce_op("max", "mccl") and native_reduce_op("max", "hccl")
    monkeypatch.setenv("MF_PARALLEL_EMULATE", "all")
    assert not is_native("reduce_scatter", "hccl", is_world=False)
    monkeypatch.setenv("MF_PARALLEL_EMULATE", "all_gather, broadcast")
    assert forced_emulation() == {"all_gather", "broadcast"}
    monkeypatch.setenv("MF_PARALLEL_EMULATE", "allgather")
    with pytest.raises(mp.ParallelConfigError, match=r"MF_PARALLEL_EMULATE: unknown collective kind\(s\) \['allgather'\]"):
        forced_emulation()


def test_graph_mode_blocker_names_the_layouts_that_must_run_eagerly():
    assert mp.graph_mode_blocker(mp.ParallelDims(2, tp=2), "mccl") is None
    assert mp.graph_mode_blocker(mp.ParallelDims(4, dp_shard=4), "mccl") is None
    reason = mp.graph_mode_blocker(mp.ParallelDims(4, dp_shard=2, tp=2), "mccl")
    assert "uses dp_shard x tp" in reason and reason.endswith("run this layout in PyNative mode")
    assert mp.graph_mode_blocker(mp.ParallelDims(4, dp_replicate=2, dp_shard=2), "hccl") is None


def test_backend_names():
    assert backend_name("CPU") == "mccl" and backend_name("Ascend") == "hccl" and backend_name("GPU") == "nccl"
    with pytest.raises(mp.ParallelConfigError, match="context.device_target: no communication backend for 'TPU'"):
        backend_name("TPU")


# ----------------------------------------------------------------------------- exact transport
class _DoubleThroughTransport(nn.Cell):
    """decode(encode(x) + encode(x)): what an all-reduce of two equal contributions computes."""

    def construct(self, x):
        e = encode(x)
        return decode(e + e, x.dtype)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_transport_is_exact_with_integer_wraparound(mode):
    ms.set_context(mode=mode)
    cell = _DoubleThroughTransport()
    # int32 sums wrap around like the type (2**31 - 1 doubled is -2); the other cases stay in range
    # (overflowing sums of int8/int64 are left to the cast, as they are on the backends).
    cases = [np.array([-5, 7, 2**31 - 1, -2**31, 123456789], np.int32),
             np.array([-2**62, 2**40 + 3, -1, 2**61 + 12345], np.int64),
             np.array([3, -100, 63], np.int8), np.array([1.5, -2.25, 3e7], np.float32)]
    for arr in cases:
        got = cell(Tensor(arr)).asnumpy()
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(got, arr + arr)
    np.testing.assert_array_equal(cell(Tensor(np.array([True, False]))).asnumpy(), [True, False])
    bf = cell(Tensor(np.array([1.5, 3.0], np.float32), ms.bfloat16)).float().asnumpy()
    np.testing.assert_array_equal(bf, [3.0, 6.0])


# ----------------------------------------------------------------------------- the counter
def test_comm_stats_accumulates_and_resets():
    stats = mp.CommStats()
    stats.record("all_gather", True, 24, 48)
    stats.record("all_gather", True, 24, 48)
    stats.record("all_reduce", False, 4, 4)
    assert stats.snapshot() == {"all_gather/emulated": {"calls": 2, "payload_bytes": 48, "issued_bytes": 96},
                                "all_reduce/native": {"calls": 1, "payload_bytes": 4, "issued_bytes": 4}}
    assert stats.payload_by_kind() == {"all_gather": 48, "all_reduce": 4}
    assert "all_gather/emulated 2x" in stats.summary()
    stats.reset()
    assert stats.snapshot() == {} and stats.summary() == "no communication"


class _Marker(nn.Cell):
    """Stands in for a collective: computes something of its own and reports it like one does."""

    _next = 0

    def __init__(self):
        super().__init__()
        self.count_op = make_count_op()
        self.code = count_code("all_gather", True)
        _Marker._next += 1
        self.shift = float(_Marker._next)    # distinct results: the compiler may not merge them

    def construct(self, x):
        out = x + self.shift
        n = out.itemsize * out.size
        return counted(out, self.count_op, self.code, n, 2 * n) - self.shift


class _Counted(nn.Cell):
    """A custom-bprop Cell whose forward and backward each run one counted "collective"."""

    def __init__(self):
        super().__init__()
        self.forward_marker = _Marker()
        self.backward_marker = _Marker()

    def construct(self, x):
        return self.forward_marker(x) * 2

    def bprop(self, x, out, dout):
        return (self.backward_marker(dout) * 2,)


class _Twice(nn.Cell):
    def __init__(self):
        super().__init__()
        self.a = _Counted()
        self.b = _Counted()

    def construct(self, x):
        return (self.b(self.a(x)) * x).sum()


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_count_op_runs_every_time_even_compiled(mode):
    """Each call is recorded, forward and backward, on every run, also when compiled (the op's side
    effect keeps it from being merged or pruned from the gradient graph)."""
    ms.set_context(mode=mode)
    net = _Twice()
    x = Tensor(np.ones(3, np.float32))
    stats = mp.comm_stats()
    stats.reset()
    for _ in range(3):
        net(x).asnumpy()
    assert stats.snapshot()["all_gather/emulated"] == {"calls": 6, "payload_bytes": 72, "issued_bytes": 144}
    stats.reset()
    ms.grad(net)(x).asnumpy()
    assert stats.snapshot()["all_gather/emulated"]["calls"] == 4    # 2 forward + 2 backward
    stats.reset()
