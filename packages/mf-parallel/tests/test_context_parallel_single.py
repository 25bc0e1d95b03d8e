"""Context parallelism in one process: the zigzag layout and batch slicing (numpy), the settings and
their one-line refusals, and the ring attention's schedule and merge maths in float64.

The ring is simulated: one `_RingCore` per virtual rank, all in this process, whose exchange hands
each rank what the previous rank passed at the same call (in this sweep if that rank ran already,
else in the previous one); sweeping until
no message changes gives every rank exactly the messages a real ring delivers (the computation
is deterministic), so the real forward and bprop code runs unchanged. The reference is full attention written here in
float64 numpy with CoreAttention's semantics (finite mask value: a fully masked row averages all
values uniformly; masked scores pass no gradient). The real Cells on 2 and 4 CPU ranks are in
tests-integration/dist/test_context_parallel.py.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

import mf_parallel as mp
from mf_parallel.cp.ring import RingAttention, _RingCore
from mf_parallel.mesh import Group

MASK = -3.4028234663852886e38


# ----------------------------------------------------------------------------- layout
def test_zigzag_chunks_pair_head_and_tail():
    np.testing.assert_array_equal(mp.zigzag_indices(8, 2, 0), [0, 1, 6, 7])
    np.testing.assert_array_equal(mp.zigzag_indices(8, 2, 1), [2, 3, 4, 5])
    np.testing.assert_array_equal(mp.zigzag_indices(16, 4, 1), [2, 3, 12, 13])
    for cp in (1, 2, 3, 4):
        every = np.concatenate([mp.zigzag_indices(24, cp, r) for r in range(cp)])
        np.testing.assert_array_equal(np.sort(every), np.arange(24))


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_zigzag_balances_causal_work(cp):
    """Each rank's queries see the same number of keys under the causal mask (sum of positions + 1)."""
    work = [int((mp.zigzag_indices(48, cp, r) + 1).sum()) for r in range(cp)]
    assert len(set(work)) == 1, work


def _megatron_columns(text: np.ndarray, eod: int = 1):
    """Packed-document columns the way Megatron builds them (reset_position_ids + reset_attention_mask)."""
    ids, labels = text[:, :-1], text[:, 1:]
    b, s = ids.shape
    doc = np.zeros((b, s), np.int64)
    doc[:, 1:] = np.cumsum(ids[:, :-1] == eod, axis=1)
    positions = np.zeros((b, s), np.int64)
    for row in range(b):
        for d in np.unique(doc[row]):
            where = np.flatnonzero(doc[row] == d)
            positions[row, where] = np.arange(where.size)
    mask = (doc[:, :, None] != doc[:, None, :]) | np.triu(np.ones((s, s), bool), 1)[None]
    ends = np.full((b, 5), s, np.int32)
    for row in range(b):
        stops = np.flatnonzero(ids[row, :-1] == eod) + 1
        ends[row, :stops.size] = stops
    return ids, labels, positions, mask[:, None], ends


def test_slicing_keeps_labels_beside_tokens_and_positions_global():
    rng = np.random.default_rng(0)
    text = rng.integers(2, 50, (2, 17))
    text[0, [4, 9]] = 1
    ids, labels, positions, mask, ends = _megatron_columns(text)
    loss_mask = rng.random((2, 16)).astype(np.float32)
    full = {"input_ids": ids, "labels": labels, "loss_mask": loss_mask, "position_ids": positions,
            "attention_mask": mask}
    for r in range(2):
        idx = mp.zigzag_indices(16, 2, r)
        got = mp.slice_for_context_parallel(full, 2, r)
        assert set(got) == {"input_ids", "labels", "loss_mask", "position_ids", "segment_ids"}
        for name in ("input_ids", "labels", "loss_mask", "position_ids"):
            np.testing.assert_array_equal(got[name], full[name][:, idx])
        np.testing.assert_array_equal(got["labels"][:, :-1][:, :3], text[:, 1:][:, idx][:, :3])
        # the global document structure: the same on every rank, and it is the dense mask exactly
        np.testing.assert_array_equal(mp.masked_from_segments(got["segment_ids"]), mask[:, 0])
        assert got["segment_ids"].dtype == np.int32 and got["segment_ids"].shape == (2, 16)
    without = mp.slice_for_context_parallel({"input_ids": ids}, 2, 1)
    np.testing.assert_array_equal(without["position_ids"], np.broadcast_to(mp.zigzag_indices(16, 2, 1), (2, 8)))
    assert "segment_ids" not in without


def test_compressed_eod_mask_gives_the_same_documents():
    text = np.random.default_rng(1).integers(2, 50, (2, 17))
    text[0, [4, 9, 10]] = 1
    text[1, [14]] = 1
    ids, _, _, mask, ends = _megatron_columns(text)
    from_mask = mp.slice_for_context_parallel({"input_ids": ids, "attention_mask": mask}, 2, 0)["segment_ids"]
    from_ends = mp.slice_for_context_parallel({"input_ids": ids, "actual_seq_len": ends}, 2, 0)["segment_ids"]
    np.testing.assert_array_equal(mp.masked_from_segments(from_ends), mp.masked_from_segments(from_mask))


def test_a_row_that_sees_nothing_becomes_padding():
    mask = np.triu(np.ones((8, 8), bool), 1)[None, None].copy()
    mask[0, 0, 3, :] = True          # row 3 sees nothing ...
    mask[0, 0, 4:, 3] = True         # ... and nobody sees token 3
    seg = mp.segment_ids_from_attention_mask(mask)
    assert seg[0, 3] == -1
    np.testing.assert_array_equal(mp.masked_from_segments(seg), mask[:, 0])


@pytest.mark.parametrize("batch, cp, message", [
    ({"input_ids": np.zeros((1, 12))}, 4, r"12 tokens does not split into 2 x context_parallel = 8 equal chunks"),
    ({"input_ids": np.zeros((1, 8)), "tokens": np.zeros((1, 8))}, 2, r"no slicing rule for column\(s\) \['tokens'\]"),
    ({"input_ids": np.zeros((1, 8)), "attention_mask": np.zeros((1, 1, 8, 8), bool),
      "actual_seq_len": np.full((1, 2), 8)}, 2, r"give one of attention_mask, actual_seq_len, not several"),
    ({"input_ids": np.zeros((1, 8)), "attention_mask": np.zeros((1, 1, 8, 8), bool)}, 2,
     r"attention_mask of sample 0 is not causal within documents \(query 0, key 1 is visible\)"),
    ({"input_ids": np.zeros((1, 8)), "actual_seq_len": np.array([3, 8])}, 2, r"must be per sample \[B, L\]"),
    ({"input_ids": np.zeros((1, 8)), "actual_seq_len": np.array([[5, 3]])}, 2, r"non-decreasing document ends"),
    ({"input_ids": np.zeros((1, 8)), "labels": np.zeros((1, 6))}, 2, r"labels has shape \[1, 6\]"),
])
def test_slicing_refuses_what_it_cannot_split(batch, cp, message):
    with pytest.raises(mp.ParallelConfigError, match=message):
        mp.slice_for_context_parallel(batch, cp, 0)


# ----------------------------------------------------------------------------- settings and checks
@pytest.mark.parametrize("kwargs, message", [
    (dict(method="ring"), r"parallelism.context_parallel_method: must be one of colossal, ulysses, hybrid, got 'ring'"),
    (dict(mask_type="full"), r"parallelism.context_parallel_mask_type: 'full' is not supported; only 'causal'"),
    (dict(method="hybrid"), r"parallelism.ulysses_degree_in_cp: is required with context_parallel_method 'hybrid'"),
    (dict(async_comm="yes"), r"context_parallel_async: must be true or false, got 'yes'"),
    (dict(method="hybrid", ulysses_degree=0), r"ulysses_degree_in_cp: must be a positive integer or null, got 0"),
])
def test_settings_refuse_with_the_yaml_key(kwargs, message):
    with pytest.raises(mp.ParallelConfigError, match=message):
        mp.ContextParallelSettings(**kwargs)


def test_settings_with_nothing_to_act_on_are_accepted():
    """A knob the method does not use changes no result (mf-trainer's preflight says so once)."""
    assert mp.ContextParallelSettings(ulysses_degree=2).ulysses_degree_for(4) == 1     # colossal: a pure ring
    assert mp.ContextParallelSettings(method="ulysses", async_comm=True).ulysses_degree_for(4) == 4


def test_settings_from_the_yaml_block():
    got = mp.ContextParallelSettings.from_config({"context_parallel_method": "hybrid", "ulysses_degree_in_cp": 2,
                                                  "context_parallel_async": True, "context_parallel": 4})
    assert got == mp.ContextParallelSettings("hybrid", 2, "causal", True)
    assert mp.ContextParallelSettings.from_config(None) == mp.ContextParallelSettings()
    assert got.ulysses_degree_for(4) == 2 and mp.ContextParallelSettings("ulysses").ulysses_degree_for(4) == 4


@pytest.mark.parametrize("dims, settings, heads, seq, message", [
    (mp.ParallelDims(8, cp=8), mp.ContextParallelSettings("ulysses"), 12, None,
     r"context_parallel: 8 does not divide the 12 attention heads a tensor-parallel rank holds; Ulysses splits heads "
     r"over the cp ranks: use context_parallel one of \[2, 4\]"),
    (mp.ParallelDims(8, cp=4, tp=2), mp.ContextParallelSettings("ulysses"), 6, None,
     r"4 does not divide the 6 attention heads a tensor-parallel rank holds \(12 / tensor_parallel 2\)"),
    (mp.ParallelDims(8, cp=8), mp.ContextParallelSettings("hybrid", 8), 8, None,
     r"ulysses_degree_in_cp: 8 must divide context_parallel 8 and lie strictly between 1 and 8 .* valid here: \[2, 4\]"),
    (mp.ParallelDims(8, cp=8), mp.ContextParallelSettings("hybrid", 4), 6, None,
     r"ulysses_degree_in_cp: 4 does not divide the 6 attention heads .* valid here: \[2\]"),
    (mp.ParallelDims(4, cp=4), mp.ContextParallelSettings(), 4, 100,
     r"a sequence of 100 tokens does not split into 2 x context_parallel = 8 equal chunks"),
])
def test_model_shape_problems_are_one_keyed_line(dims, settings, heads, seq, message):
    problems = mp.context_parallel_problems(dims, settings, heads, heads, seq)
    assert len(problems) == 1
    with pytest.raises(mp.ParallelConfigError, match=message):
        mp.check_context_parallel(dims, settings, heads, heads, seq)


def test_hybrid_subgroups_split_the_cp_axis():
    dims = mp.ParallelDims(16, dp_shard=2, cp=4, tp=2)        # cp ranks of rank 0: 0, 2, 4, 6
    assert dims.group_ranks("cp", 0) == [0, 2, 4, 6]
    assert dims.cp_subgroup_ranks("cp_ulysses", 4, 2) == [4, 6]
    assert dims.cp_subgroup_ranks("cp_ring", 4, 2) == [0, 4]
    assert dims.cp_subgroup_ranks("cp_ring", 13, 2) == [9, 13]          # cp ranks of 13: 9, 11, 13, 15
    assert dims.cp_subgroup_ranks("cp_ulysses", 13, 2) == [13, 15]
    with pytest.raises(mp.ParallelConfigError, match=r"ulysses_degree_in_cp: 3 does not divide context_parallel 4"):
        dims.cp_subgroup_ranks("cp_ring", 0, 3)


# ----------------------------------------------------------------------------- the ring, simulated
def full_attention(q, k, v, masked, scale, dout):
    """float64 attention with CoreAttention's semantics, and its gradients for `dout`."""
    b, heads, s, _ = q.shape
    g = heads // k.shape[1]
    kr, vr = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    scores = np.where(masked[:, None], MASK, q @ kr.transpose(0, 1, 3, 2) * scale)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = dout @ vr.transpose(0, 1, 3, 2)
    ds = np.where(masked[:, None], 0.0, p * (dp - (dp * p).sum(-1, keepdims=True)))
    dk = (ds.transpose(0, 1, 3, 2) @ q * scale).reshape(b, k.shape[1], g, s, -1).sum(2)
    dv = (p.transpose(0, 1, 3, 2) @ dout).reshape(b, k.shape[1], g, s, -1).sum(2)
    return p @ vr, ds @ kr * scale, dk, dv


class _Wire:
    """The messages of one simulated ring: what each rank sent at each call, sweep by sweep."""

    def __init__(self, n):
        self.n, self.previous, self.current = n, {}, {}

    def sweep(self) -> bool:
        """Start the next sweep; True when this one sent exactly what the previous one did."""
        settled = self.current.keys() == self.previous.keys() and all(
            np.array_equal(self.current[key], self.previous[key]) for key in self.current)
        self.previous, self.current = self.current, {}
        return settled


class _SimulatedExchange:
    def __init__(self, wire, rank):
        self.wire, self.rank, self.calls = wire, rank, 0

    def __call__(self, x):
        key = (self.rank, self.calls)
        self.calls += 1
        self.wire.current[key] = x.asnumpy()
        source = ((self.rank - 1) % self.wire.n, key[1])
        # Ranks run in order within a sweep: the previous rank's message of this sweep, if sent yet.
        sent = self.wire.current.get(source, self.wire.previous.get(source))
        return Tensor(np.zeros(x.shape) if sent is None else sent, x.dtype)


def simulate_ring(n, q, k, v, seg, dout, scale, async_comm):
    wire = _Wire(n)
    cores = [_RingCore(Group("cp", tuple(range(n)), r, "", "mccl", False), scale, async_comm,
                       exchange=_SimulatedExchange(wire, r)) for r in range(n)]
    idx = [mp.zigzag_indices(q.shape[2], n, r) for r in range(n)]
    segments = None if seg is None else Tensor(seg.astype(np.int32))
    for _ in range(4 * n + 4):          # each sweep settles at least one more message of the chain
        results = []
        for r, core in enumerate(cores):
            core.exchange.calls = 0
            args = tuple(Tensor(np.ascontiguousarray(a[:, :, idx[r]])) for a in (q, k, v)) + (segments,)
            out = core(*args)
            grads = core.bprop(*args, out, (Tensor(np.ascontiguousarray(dout[:, :, idx[r]])), None, None))
            results.append((out[0].asnumpy(), *(g.asnumpy() for g in grads[:3])))
        if wire.sweep():
            break
    else:
        raise AssertionError("the simulated ring never settled")
    assembled = [np.zeros(q.shape[:3] + (v.shape[-1],)), np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)]
    for r in range(n):
        for i in range(4):
            assembled[i][:, :, idx[r]] = results[r][i]
    return assembled


def _inputs(heads, kv_heads, s, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, heads, s, 3)), rng.standard_normal((2, kv_heads, s, 3)),
            rng.standard_normal((2, kv_heads, s, 5)), rng.standard_normal((2, heads, s, 5)))


def _packed(s):
    """Uneven documents crossing chunk boundaries, padding rows (-1: fully masked) in both samples."""
    seg = np.zeros((2, s), np.int32)
    seg[0, 5:12], seg[0, 12:14], seg[0, 14:] = 5, -1, 14
    seg[1, s // 2:], seg[1, -3:] = s // 2, -1
    return seg


@pytest.mark.parametrize("n, packed", [(1, True), (2, True), (3, True), (4, True), (3, False)])
def test_simulated_ring_is_full_attention_in_float64(n, packed):
    s = 24 if n == 3 else 16
    q, k, v, dout = _inputs(4, 2, s, seed=n)
    seg = _packed(s) if packed else None
    masked = mp.masked_from_segments(seg) if packed else np.broadcast_to(np.triu(np.ones((s, s), bool), 1), (2, s, s))
    if packed:
        assert masked.all(-1).any(), "the case must contain fully masked rows"
    want = full_attention(q, k, v, masked, 0.7, dout)
    got = simulate_ring(n, q, k, v, seg, dout, 0.7, async_comm=False)
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=name)


def test_simulated_async_ring_computes_the_same():
    q, k, v, dout = _inputs(2, 1, 16, seed=9)
    seg = _packed(16)
    sync = simulate_ring(4, q, k, v, seg, dout, 0.5, async_comm=False)
    overlap = simulate_ring(4, q, k, v, seg, dout, 0.5, async_comm=True)
    for a, b in zip(sync, overlap):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_one_rank_ring_compiles_and_matches_in_float32(mode):
    q, k, v, dout = _inputs(4, 2, 16, seed=3)
    seg = _packed(16)
    want = full_attention(q, k, v, mp.masked_from_segments(seg), 0.4, dout)
    cell = RingAttention(Group("cp", (0,), 0, "", "mccl", False), 0.4)

    class Weighted(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.attn = cell

        def construct(self, q, k, v, seg, dout):
            return (self.attn(q, k, v, seg) * dout).sum()

    args = tuple(Tensor(a.astype(np.float32)) for a in (q, k, v)) + (Tensor(seg), Tensor(dout.astype(np.float32)))
    ms.set_context(mode=mode)
    try:
        out = cell(*args[:4]).asnumpy()
        grads = ms.grad(Weighted(), grad_position=(0, 1, 2))(*args)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    for got, w in zip([out] + [g.asnumpy() for g in grads], want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5 * np.abs(w).max())
