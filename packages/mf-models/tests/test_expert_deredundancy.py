"""The two-level `alltoall_deredundancy` dispatcher (mf_parallel.DeredundancyTokenDispatcher) on
simulated ep ranks, against the one-rank MoE dispatch of every token.

The ranks are simulated in this process, as the ring of tests in mf-parallel: each rank's
dispatcher is built on group descriptions of 2-4 members, and its collectives (the all-to-alls
inside each `ExpertExchange`, forward and backward, and the all-gathers of the expert ids) are
replaced by a wire that hands each rank what the other members passed at the same call (in this
sweep if that rank ran already, else in the previous one). Sweeping the ranks' forward + backward
until no message changes gives every rank exactly what a real exchange delivers, so the real
dispatch, combine and bprop code runs unchanged. The reference is `LocalDispatcher` over all
experts on the concatenated tokens (every token's output and every gradient: x, router weights,
the stacked experts). The wire also counts the rows each rank sends to other ranks / device
groups, which must equal `mf_parallel.routed_rows` for both dispatchers. The real exchange on 4
CPU ranks is the dist case moe_ep4_deredundancy (tests-integration/dist/test_moe_parity.py).
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


class _SimCollective(ms.nn.Cell):
    """One rank's end of a simulated all-to-all (dim 0 slots) or all-gather (dim 0) over `members`
    (world ranks), keyed by `label` and the call's index on this rank. A Cell (PyNative runs its
    Python body), so it can stand in for the collective Cells."""

    def __init__(self, wire, label, kind, members, rank):
        super().__init__()
        self.wire, self.label, self.kind, self.members, self.rank = wire, label, kind, members, rank
        self.calls = 0

    def construct(self, x):
        key = (self.label, self.calls)
        self.calls += 1
        self.wire.current[key + (self.rank,)] = x.asnumpy()
        me = self.members.index(self.rank)
        sent = [self.wire.current.get(key + (s,), self.wire.previous.get(key + (s,))) for s in self.members]
        sent = [np.zeros(x.shape, x.asnumpy().dtype) if m is None else m for m in sent]
        if self.kind == "a2a":
            return Tensor(np.stack([m[me] for m in sent]), x.dtype)
        return Tensor(np.concatenate(sent), x.dtype)


def _simulate(dispatcher, cells, wire, rank):
    """Replace `dispatcher`'s collectives by wire ends. cells: attribute -> (kind, group members)."""
    sims = []
    for attr, (kind, group) in cells.items():
        cell = getattr(dispatcher, attr)
        if kind == "a2a":        # an ExpertExchange: its forward and backward all-to-alls
            for inner in ("forward_a2a", "backward_a2a"):
                sim = _SimCollective(wire, f"{attr}.{inner}", kind, group, rank)
                setattr(cell, inner, sim)
                sims.append(sim)
        else:
            sim = _SimCollective(wire, attr, kind, group, rank)
            setattr(dispatcher, attr, sim)
            sims.append(sim)
    return sims


def _group(label, members, rank):
    return Group(label, tuple(members), members.index(rank), "mf_simulated", "mccl", False)


def build_ranks(kind, ep, group_size, experts, top_k, wire):
    """Every rank's dispatcher of `kind` ("alltoall" | "deredundancy") with simulated collectives."""
    ranks = []
    for r in range(ep):
        local = LocalDispatcher(experts // ep + 1, 1)
        if kind == "alltoall":
            members = list(range(ep))
            d = mp.AllToAllTokenDispatcher(_group("ep", members, r), experts, top_k, local)
            cells = {"exchange": ("a2a", members), "reverse": ("a2a", members), "expert_ids": ("gather", members)}
        else:
            within, across = device_group_ranks(list(range(ep)), group_size, r)
            d = mp.DeredundancyTokenDispatcher(_group("ep_within", within, r), _group("ep_across", across, r),
                                               experts, top_k, local)
            cells = {"across_tokens": ("a2a", across), "across_weights": ("a2a", across),
                     "within_tokens": ("a2a", within), "within_back": ("a2a", within),
                     "across_back": ("a2a", across), "ids_across": ("gather", across),
                     "ids_within": ("gather", within)}
        ranks.append((d, _simulate(d, cells, wire, r)))
    return ranks


def _rank_step(dispatcher, experts, x, idx, w, ws, probe):
    def fn(x, w, w1, w2, w3):
        rows, block_expert, handle, load, _ = dispatcher.dispatch(x, idx)
        out = dispatcher.combine(experts_forward(experts, w1, w2, w3, rows, block_expert), handle, w)
        return (out * probe).sum(), (out, load)

    (_, (out, load)), grads = ms.value_and_grad(fn, grad_position=(0, 1, 2, 3, 4), has_aux=True)(x, w, *ws)
    return out.asnumpy(), load.asnumpy(), [g.asnumpy() for g in grads]


def run_simulated(kind, ep, group_size, data):
    x, idx, w, ws, probe, experts = data
    t, e, k = x.shape[0] // ep, ws[0].shape[0], idx.shape[1]
    le = e // ep
    wire = _Wire()
    ranks = build_ranks(kind, ep, group_size, e, k, wire)
    for _ in range(40):
        results = []
        for r, (d, sims) in enumerate(ranks):
            for sim in sims:
                sim.calls = 0
            rows = slice(r * t, (r + 1) * t)
            local_ws = [Tensor(wt[r * le:(r + 1) * le]) for wt in ws]
            results.append(_rank_step(d, experts, Tensor(x[rows]), Tensor(idx[rows]), Tensor(w[rows]), local_ws,
                                      Tensor(probe[rows])))
        sent = wire.current
        if wire.sweep():
            break
    else:
        raise AssertionError("the simulated exchange never settled")
    out = np.concatenate([res[0] for res in results])
    load = sum(res[1] for res in results)
    grads = [np.concatenate([res[2][i] for res in results]) for i in range(5)]
    return out, load, grads, sent


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


def _sent_rows(sent, label, source_slot_owner):
    """Rows a rank's buffer sent through `label` to another destination: non-zero slot rows whose
    destination (per `source_slot_owner(rank, slot)`) is not the sender itself."""
    rows = 0
    for (lab, call, rank), buf in sent.items():
        if lab != label or call != 0:
            continue
        for slot in range(buf.shape[0]):
            if not source_slot_owner(rank, slot):
                rows += int((np.abs(buf[slot]).reshape(buf.shape[1], -1).max(1) > 0).sum())
    return rows


@pytest.fixture(autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)


@pytest.mark.parametrize("ep, group_size, experts, top_k, clustered", [
    (4, 2, 8, 3, False), (4, 2, 8, 2, True), (4, 1, 4, 2, False), (4, 4, 8, 2, False), (2, 2, 4, 2, False)])
def test_two_level_dispatch_is_the_one_rank_moe(ep, group_size, experts, top_k, clustered):
    data = make_data(ep, 5, experts, top_k, clustered=clustered, seed=ep * 10 + group_size)
    out, load, grads, sent = run_simulated("deredundancy", ep, group_size, data)
    want_out, want_load, want_grads = reference(data)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(load, want_load)
    for name, got, want in zip(("x", "weights", "w1", "w2", "w3"), grads, want_grads):   # experts: rank order
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)

    # the rows that crossed device groups / reached another rank of the group: routed_rows' count
    x, idx, *_ = data
    t = x.shape[0] // ep
    counts = [mp.routed_rows(idx[r * t:(r + 1) * t], experts, ep, group_size, r) for r in range(ep)]
    across = _sent_rows(sent, "across_tokens.forward_a2a", lambda r, slot: slot == r // group_size)
    within = _sent_rows(sent, "within_tokens.forward_a2a", lambda r, slot: slot == r % group_size)
    assert across == sum(c["deredundancy_across"] for c in counts)
    assert within == sum(c["deredundancy_within"] for c in counts)


@pytest.mark.parametrize("clustered", [False, True])
def test_deredundancy_sends_fewer_rows_across_groups_than_alltoall(clustered):
    """Same routing through both dispatchers: alltoall's rows to other device groups (counted on
    its wire) are one per remote assignment; deredundancy's one per remote group hit, fewer
    whenever a token picks several experts of one remote group (always, in the clustered case)."""
    ep, g, e, k = 4, 2, 8, 2
    data = make_data(ep, 6, e, k, clustered=clustered, seed=7)
    out_a, _, grads_a, sent_a = run_simulated("alltoall", ep, g, data)
    out_d, _, grads_d, sent_d = run_simulated("deredundancy", ep, g, data)
    np.testing.assert_allclose(out_d, out_a, rtol=1e-5, atol=1e-6)
    a2a_across = _sent_rows(sent_a, "exchange.forward_a2a", lambda r, slot: slot // g == r // g)
    der_across = _sent_rows(sent_d, "across_tokens.forward_a2a", lambda r, slot: slot == r // g)
    x, idx, *_ = data
    t = x.shape[0] // ep
    counts = [mp.routed_rows(idx[r * t:(r + 1) * t], e, ep, g, r) for r in range(ep)]
    assert a2a_across == sum(c["alltoall_across"] for c in counts)
    assert der_across == sum(c["deredundancy_across"] for c in counts)
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
