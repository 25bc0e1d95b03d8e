"""The expert-parallel dispatchers (mf_parallel.AllToAllTokenDispatcher and the two-level
`alltoall_deredundancy` DeredundancyTokenDispatcher) on simulated ep ranks, against the one-rank
MoE dispatch of every token, and the bytes they move against the routing's analytic count.

The ranks are simulated in this process: each rank's dispatcher is built on group descriptions of
2-4 members, and the one primitive under every emulated collective - the all-reduce(sum) each
collective Cell issues (`sum_prim`) - is replaced by a wire that sums what the other members passed
at the same call (in this sweep if that rank ran already, else in the previous one). Everything
above it runs unchanged: the counts-first variable all-to-all (`AllToAllV`: counts, padding, slot
matrix, trimming and its byte counting), the exchanges' bprops, dispatch and combine. Sweeping the
ranks' forward + backward until no message changes gives every rank exactly what a real exchange
delivers. The reference is `LocalDispatcher` over all experts on the concatenated tokens (every
token's output and every gradient: x, router weights, the stacked experts). The bytes of the last
sweep (`comm_stats`, every simulated rank together) must be `mf_parallel.routed_rows`' rows times
the row sizes. The real exchange on 2 and 4 CPU ranks: the dist cases moe_ep2 and
moe_ep4_deredundancy (tests-integration/dist/test_moe_parity.py).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

import mf_parallel as mp
from mf_models.common.dispatch import LocalDispatcher
from mf_models.common.moe import MoE, experts_forward
from mf_models.common.router import RouterSpec
from mf_parallel.collectives import CollectiveOp
from mf_parallel.expert_deredundancy import device_group_ranks
from mf_parallel.mesh import Group


class _Wire:
    def __init__(self):
        self.previous, self.current = {}, {}

    def sweep(self) -> bool:
        settled = self.current.keys() == self.previous.keys() and all(
            np.array_equal(self.current[key], self.previous[key]) for key in self.current)
        self.previous, self.current = self.current, {}
        return settled


class _SimAllReduce(ms.nn.Cell):
    """One rank's end of a simulated all-reduce(sum) over `members` (world ranks), keyed by
    `label` and the call's index on this rank. A message of another shape (from a sweep whose
    counts had not settled yet) counts as missing."""

    def __init__(self, wire, label, members, rank):
        super().__init__()
        self.wire, self.label, self.members, self.rank = wire, label, members, rank
        self.calls = 0

    def construct(self, x):
        key = (self.label, self.calls)
        self.calls += 1
        mine = x.asnumpy()
        self.wire.current[key + (self.rank,)] = mine
        total = np.zeros_like(mine)
        for s in self.members:
            sent = self.wire.current.get(key + (s,), self.wire.previous.get(key + (s,)))
            if sent is not None and sent.shape == mine.shape:
                total = total + sent
        return Tensor(total, x.dtype)


def _simulate(dispatcher, members, wire, rank):
    """Replace the all-reduce under each collective of `dispatcher` by a wire end. members: group
    label -> world ranks."""
    sims = []
    for name, cell in dispatcher.cells_and_names():
        if isinstance(cell, CollectiveOp) and cell.n > 1:
            sim = _SimAllReduce(wire, name, members[cell.group_label], rank)
            object.__setattr__(cell, "sum_prim", sim)
            sims.append(sim)
    return sims


def _group(label, members, rank):
    return Group(label, tuple(members), members.index(rank), "mf_simulated", "mccl", False)


def build_ranks(kind, ep, group_size, experts, top_k, wire, variable=True):
    """Every rank's dispatcher of `kind` ("alltoall" | "deredundancy") with simulated collectives;
    `variable` False: the static buffers of GRAPH_MODE (run here in PyNative)."""
    ranks = []
    for r in range(ep):
        local = LocalDispatcher(experts // ep + 1, 1)
        if kind == "alltoall":
            members = {"ep": list(range(ep))}
            d = mp.AllToAllTokenDispatcher(_group("ep", members["ep"], r), experts, top_k, local)
        else:
            within, across = device_group_ranks(list(range(ep)), group_size, r)
            members = {"ep_within": within, "ep_across": across}
            d = mp.DeredundancyTokenDispatcher(_group("ep_within", within, r), _group("ep_across", across, r),
                                               experts, top_k, local)
        d.variable = variable
        ranks.append((d, _simulate(d, members, wire, r)))
    return ranks


def _rank_step(dispatcher, experts, x, idx, w, ws, probe):
    def fn(x, w, w1, w2, w3):
        rows, block_expert, handle, load, _ = dispatcher.dispatch(x, idx)
        out = dispatcher.combine(experts_forward(experts, w1, w2, w3, rows, block_expert), handle, w)
        return (out * probe).sum(), (out, load)

    (_, (out, load)), grads = ms.value_and_grad(fn, grad_position=(0, 1, 2, 3, 4), has_aux=True)(x, w, *ws)
    return out.asnumpy(), load.asnumpy(), [g.asnumpy() for g in grads]


def run_simulated(kind, ep, group_size, data, variable=True):
    """(output, load, grads, comm_stats snapshot of the settled sweep: every rank together)."""
    x, idx, w, ws, probe, experts = data
    t, e, k = x.shape[0] // ep, ws[0].shape[0], idx.shape[1]
    le = e // ep
    wire = _Wire()
    ranks = build_ranks(kind, ep, group_size, e, k, wire, variable)
    for _ in range(40):
        mp.comm_stats().reset()
        results = []
        for r, (d, sims) in enumerate(ranks):
            for sim in sims:
                sim.calls = 0
            rows = slice(r * t, (r + 1) * t)
            local_ws = [Tensor(wt[r * le:(r + 1) * le]) for wt in ws]
            results.append(_rank_step(d, experts, Tensor(x[rows]), Tensor(idx[rows]), Tensor(w[rows]), local_ws,
                                      Tensor(probe[rows])))
        moved = mp.comm_stats().snapshot()
        if wire.sweep():
            break
    else:
        raise AssertionError("the simulated exchange never settled")
    out = np.concatenate([res[0] for res in results])
    load = sum(res[1] for res in results)
    grads = [np.concatenate([res[2][i] for res in results]) for i in range(5)]
    return out, load, grads, moved


def reference(data):
    x, idx, w, ws, probe, experts = data
    e, k = ws[0].shape[0], idx.shape[1]
    out, load, grads = _rank_step(LocalDispatcher(e, k), experts, Tensor(x), Tensor(idx), Tensor(w),
                                  [Tensor(a) for a in ws], Tensor(probe))
    return out, load, grads


def make_data(ep, tokens_per_rank, experts, top_k, hidden=8, inner=6, clustered=False, seed=0):
    rng = np.random.default_rng(seed)
    t = ep * tokens_per_rank
    if clustered:      # every token keeps its k experts inside one device-group-sized block of experts
        block = experts // 2
        idx = np.stack([rng.choice(block, top_k, replace=False) + block * rng.integers(2) for _ in range(t)])
    else:
        idx = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(t)])
    x = rng.normal(size=(t, hidden)).astype(np.float32)
    w = rng.uniform(0.1, 1, (t, top_k)).astype(np.float32)
    ws = [(rng.normal(size=s) * 0.3).astype(np.float32)
          for s in ((experts, inner, hidden), (experts, hidden, inner), (experts, inner, hidden))]
    probe = rng.normal(size=(t, hidden)).astype(np.float32)
    experts_cell = MoE(hidden, inner, RouterSpec(experts, top_k)).experts
    return x, idx.astype(np.int32), w, ws, probe, experts_cell


def analytic_bytes(kind, data, ep, group_size):
    """Bytes one training step (forward + backward) of the variable exchange sends to other ranks,
    every rank together, from the routing: (all_to_all_v rows, all_to_all counts)."""
    x, idx, *_ = data
    t, e, k, h = x.shape[0] // ep, data[3][0].shape[0], idx.shape[1], x.shape[1]
    rows = [mp.routed_rows(idx[r * t:(r + 1) * t], e, ep, group_size, r) for r in range(ep)]
    m, le = ep // group_size, e // ep
    if kind == "alltoall":      # tokens out and back, both gradients; the [P, E/P] counts
        return sum(c["alltoall_remote"] for c in rows) * 4 * h * 4, ep * (ep - 1) * le * 4
    across = sum(c["deredundancy_across"] for c in rows) * (4 * h + 3 * k) * 4   # + ids once, weights and grad
    within = sum(c["deredundancy_within"] for c in rows) * 4 * h * 4
    return across + within, ep * ((m - 1) + (group_size - 1) * le) * 4


@pytest.fixture(autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)


def _check_parity(got, want):
    (out, load, grads, _), (want_out, want_load, want_grads) = got, want
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(load, want_load)
    for name, a, b in zip(("x", "weights", "w1", "w2", "w3"), grads, want_grads):   # experts: rank order
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def _moved(stats, kind):
    return stats.get(f"{kind}/emulated", {}).get("payload_bytes", 0)


@pytest.mark.parametrize("kind, ep, group_size, experts, top_k, clustered", [
    ("deredundancy", 4, 2, 8, 3, False), ("deredundancy", 4, 2, 8, 2, True), ("deredundancy", 4, 1, 4, 2, False),
    ("deredundancy", 4, 4, 8, 2, False), ("deredundancy", 2, 2, 4, 2, False), ("alltoall", 4, 2, 8, 3, False),
    ("alltoall", 2, 2, 4, 2, True)])
def test_variable_exchange_is_the_one_rank_moe_and_moves_the_routed_bytes(kind, ep, group_size, experts, top_k,
                                                                         clustered):
    """Counts first, then only the routed rows: outputs, loads and gradients of one rank, and the
    bytes sent to other ranks in a step are the routing's rows x row sizes (routed_rows)."""
    data = make_data(ep, 5, experts, top_k, clustered=clustered, seed=ep * 10 + group_size)
    got = run_simulated(kind, ep, group_size, data)
    _check_parity(got, reference(data))
    rows_bytes, counts_bytes = analytic_bytes(kind, data, ep, group_size)
    assert _moved(got[3], "all_to_all_v") == rows_bytes, got[3]
    assert _moved(got[3], "all_to_all") == counts_bytes, got[3]
    assert set(got[3]) <= {"all_to_all_v/emulated", "all_to_all/emulated"}, got[3]     # no static buffers


@pytest.mark.parametrize("kind", ["alltoall", "deredundancy"])
def test_static_buffers_of_graph_mode_are_the_one_rank_moe(kind):
    """The static worst-case buffers GRAPH_MODE keeps (run here eagerly, on simulated ranks)."""
    data = make_data(4, 5, 8, 3, seed=41)
    got = run_simulated(kind, 4, 2, data, variable=False)
    _check_parity(got, reference(data))
    assert "all_to_all_v/emulated" not in got[3] and _moved(got[3], "all_to_all") > 0


@pytest.mark.parametrize("clustered", [False, True])
def test_deredundancy_sends_fewer_rows_across_groups_than_alltoall(clustered):
    """Same routing through both dispatchers: alltoall sends one row across device groups per
    remote assignment; deredundancy one per remote group hit, fewer whenever a token picks several
    experts of one remote group (always, in the clustered case). The rows are read from the bytes
    the variable exchange moved (tokens out, back and both gradients: 4 H floats a row; the
    deredundancy level-1 rows also carry k ids and k router weights and their gradient)."""
    ep, g, e, k = 4, 2, 8, 2
    h = 8
    data = make_data(ep, 6, e, k, hidden=h, clustered=clustered, seed=7)
    got_a = run_simulated("alltoall", ep, g, data)
    got_d = run_simulated("deredundancy", ep, g, data)
    np.testing.assert_allclose(got_d[0], got_a[0], rtol=1e-5, atol=1e-6)
    x, idx, *_ = data
    t = x.shape[0] // ep
    counts = [mp.routed_rows(idx[r * t:(r + 1) * t], e, ep, g, r) for r in range(ep)]
    remote = sum(c["alltoall_remote"] for c in counts)
    a2a_across = sum(c["alltoall_across"] for c in counts)
    der_across = sum(c["deredundancy_across"] for c in counts)
    der_within = sum(c["deredundancy_within"] for c in counts)
    assert _moved(got_a[3], "all_to_all_v") == remote * 4 * h * 4
    assert _moved(got_d[3], "all_to_all_v") == der_across * (4 * h + 3 * k) * 4 + der_within * 4 * h * 4
    assert der_across < a2a_across
    if clustered:            # each token's experts in one group: one row across instead of k
        assert der_across * k == a2a_across


def test_device_groups_tile_the_ep_group_and_bad_sizes_are_one_keyed_line():
    assert device_group_ranks([10, 11, 12, 13, 14, 15], 2, 3) == ([12, 13], [11, 13, 15])
    assert mp.deredundancy_problem(8, 2) is None and mp.deredundancy_problem(4, 4) is None
    assert "3 does not divide expert_parallel 4" in mp.deredundancy_problem(4, 3)
    assert "expert_parallel >= npu_nums_per_device); use one of [1, 2, 4]" in mp.deredundancy_problem(4, 8)


def test_one_rank_two_level_dispatcher_compiles_and_is_the_local_dispatcher():
    """Groups of one rank (every collective the identity): the dispatcher's own tensor code in a
    GRAPH_MODE cell gives the one-rank MoE's output (the Trainer's dist case runs PyNative)."""
    e, k = 4, 2
    x, idx, w, ws, probe, experts = make_data(1, 9, e, k, seed=3)
    one = Group("ep", (0,), 0, "", "mccl", False)

    class Layer(ms.nn.Cell):
        def __init__(self, dispatcher):
            super().__init__()
            self.dispatcher, self.experts = dispatcher, experts

        def construct(self, x, idx, w, w1, w2, w3):
            rows, block_expert, handle, _, _ = self.dispatcher.dispatch(x, idx)
            return self.dispatcher.combine(experts_forward(self.experts, w1, w2, w3, rows, block_expert), handle, w)

    args = (Tensor(x), Tensor(idx), Tensor(w), *(Tensor(a) for a in ws))
    want = Layer(LocalDispatcher(e, k))(*args).asnumpy()
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        got = Layer(mp.DeredundancyTokenDispatcher(one, one, e, k, LocalDispatcher(e + 1, 1)))(*args).asnumpy()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
