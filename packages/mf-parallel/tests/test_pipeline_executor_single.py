"""The pipeline executor and the dx/dw split in one process (the multi-rank proof is in
tests-integration/dist/test_pipeline_parity.py): one pipeline rank holding two chunks, which
exercises the local hand-off between virtual stages, deferred weight gradients, recomputed
forwards and the step's bookkeeping, against MindSpore's own autodiff of the unsplit model."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, mint, nn, ops

import mf_parallel as mp
from mf_parallel.mesh import make_group
from mf_parallel.pipeline import PipelineSpec, build_schedule, validate_schedule
from mf_parallel.pipeline.executor import _tapes_kept
from mf_parallel.pipeline.weight_grad import WeightGradStash, defer_weight_grads

H = 8


@pytest.fixture(autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    yield


class Block(nn.Cell):
    def __init__(self, seed: int, bias: bool):
        super().__init__()
        rng = np.random.default_rng(seed)
        self.fc1 = mint.nn.Linear(H, 2 * H, bias=bias)
        self.fc2 = mint.nn.Linear(2 * H, H, bias=bias)
        for lin in (self.fc1, self.fc2):
            for p in lin.trainable_params():          # mint's own init is random: make it the seed's
                p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.3))

    def construct(self, x):
        return x + self.fc2(ops.tanh(self.fc1(x)))


class Chunk(nn.Cell):
    """A model chunk as the executor takes it: chunk(x, mb), input_spec, output_spec."""

    def __init__(self, seed: int, first: bool, bias: bool = True):
        super().__init__()
        self.first = first
        self.block = Block(seed, bias)
        for p in self.block.trainable_params():
            p.name = f"chunk{seed}.{p.name}"           # two chunks, distinct parameter names

    def construct(self, x, mb):
        return self.block(mb["x"] if self.first else x)

    def input_spec(self, mb):
        return mb["x"].shape, ms.float32

    def output_spec(self, mb):
        return mb["x"].shape, ms.float32


def _loss(out, mb):
    return ((out - mb["y"]) ** 2).sum() * 0.01


def _micro_batches(m: int):
    rng = np.random.default_rng(3)
    return [{"x": Tensor(rng.standard_normal((4, H)).astype(np.float32)),
             "y": Tensor(rng.standard_normal((4, H)).astype(np.float32))} for _ in range(m)]


def _reference(chunks, mbs):
    params = [p for c in chunks for p in c.trainable_params()]
    total, acc = 0.0, None
    for mb in mbs:
        def f(mb=mb):
            return _loss(chunks[1](chunks[0](None, mb), mb), mb)
        out, vjp_fn = ms.vjp(f, weights=params)
        _, g = vjp_fn(ops.ones_like(out))
        total += float(out.asnumpy())
        acc = [x.asnumpy() for x in g] if acc is None else [a + x.asnumpy() for a, x in zip(acc, g)]
    return total, {p.name: a for p, a in zip(params, acc)}


@pytest.mark.parametrize("schedule, split", [("interleaved_1f1b", False), ("interleaved_1f1b", True), ("zbv", True)])
@pytest.mark.parametrize("m", [1, 3])
def test_one_rank_two_chunks_match_autodiff(schedule, split, m):
    # zbv on one rank: the V's two legs meet on rank 0, and its order (warm-up F, F B W triples
    # with W at once, the cool-down's deferred Ws) runs through the executor unchanged
    ref_chunks = [Chunk(0, True), Chunk(1, False)]
    ref_loss, ref = _reference(ref_chunks, _micro_batches(m))
    chunks = [Chunk(0, True), Chunk(1, False)]
    spec = PipelineSpec(1, schedule, 2, split_backward=split)
    schedule = build_schedule(spec, m)
    validate_schedule(schedule)
    executor = mp.PipelineExecutor(schedule, chunks, make_group("pp", [0]))
    assert len(executor.deferred) == (4 if split else 0)
    result = executor.step(_micro_batches(m), _loss)
    assert result.loss == pytest.approx(ref_loss, rel=1e-6)
    for p, g in zip(executor.params, result.grads):
        np.testing.assert_allclose(g.asnumpy(), ref[p.name], rtol=1e-5, atol=1e-7, err_msg=p.name)
    assert result.compute_seconds > 0 and result.comm_seconds == 0 and len(result.actions) == len(schedule.actions(0))
    again = executor.step(_micro_batches(m), _loss)                 # a second step starts clean
    for a, b in zip(result.grads, again.grads):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


class SideChunk(Chunk):
    """A chunk with side outputs (as a MoE stage's balance loss and routing counts): a scalar
    term of the objective and a statistic that is summed, not differentiated."""

    side_outputs = True

    def construct(self, x, mb):
        out = super().construct(x, mb)
        return out, (out ** 2).mean() * 0.1, ops.stop_gradient((out > 0).astype(ms.float32).sum(0))


@pytest.mark.parametrize("schedule, split", [("interleaved_1f1b", False), ("interleaved_1f1b", True), ("zbv", True)])
def test_side_losses_are_differentiated_in_their_own_chunks_and_stats_summed(schedule, split):
    """Each chunk's side loss is a term of the step's objective, differentiated in that chunk's
    backward (the first chunk's too, whose output gradient comes from the next stage); the stats
    come from the forwards only (recomputed forwards do not count twice)."""
    m, mbs = 3, _micro_batches(3)
    ref_chunks = [SideChunk(0, True), SideChunk(1, False)]
    params = [p for c in ref_chunks for p in c.trainable_params()]
    ref_loss, ref_side, ref_stats, ref = 0.0, 0.0, [0.0, 0.0], {p.name: 0.0 for p in params}
    for mb in mbs:
        def f(mb=mb):
            h, side0, _ = ref_chunks[0](None, mb)
            out, side1, _ = ref_chunks[1](h, mb)
            return _loss(out, mb) + side0 + side1
        out, vjp_fn = ms.vjp(f, weights=params)
        ref_loss += float(out.asnumpy())
        for p, g in zip(params, vjp_fn(ops.ones_like(out))[1]):
            ref[p.name] = ref[p.name] + g.asnumpy()
        h, side0, stat0 = ref_chunks[0](None, mb)
        _, side1, stat1 = ref_chunks[1](h, mb)
        ref_side += float(side0.asnumpy()) + float(side1.asnumpy())
        ref_stats = [ref_stats[0] + stat0.asnumpy(), ref_stats[1] + stat1.asnumpy()]
    chunks = [SideChunk(0, True), SideChunk(1, False)]
    executor = mp.PipelineExecutor(build_schedule(PipelineSpec(1, schedule, 2, split_backward=split), m), chunks,
                                   make_group("pp", [0]))
    assert len(executor.keep_tape) < 2 * m                   # some backwards recompute their forward
    result = executor.step(mbs, _loss)
    assert result.loss == pytest.approx(ref_loss, rel=1e-6)
    assert result.side_loss == pytest.approx(ref_side, rel=1e-6) and ref_side > 0
    assert result.local_side_loss == result.side_loss        # one pipeline rank holds every chunk
    for got, want in zip(result.stats, ref_stats):
        np.testing.assert_array_equal(got[0].asnumpy(), want)
    for p, g in zip(executor.params, result.grads):
        np.testing.assert_allclose(g.asnumpy(), ref[p.name], rtol=1e-5, atol=1e-7, err_msg=p.name)


def test_combined_backward_then_forward_runs_in_its_order_bit_for_bit():
    """overlap_b_f's 1F1B pair B_i + F_{i+1} (one rank, one chunk with side outputs): the combined
    actions run backward first, and the step's loss, side loss, stats and gradients are the
    unpaired schedule's bit for bit."""
    mbs = _micro_batches(4)
    results = []
    for overlap in (False, True):
        spec = PipelineSpec(1, "1f1b", 1, overlap_b_f=overlap)
        schedule = build_schedule(spec, 4)
        validate_schedule(schedule)
        pairs = [a for a in schedule.actions(0) if type(a).__name__ == "Combined"]
        assert bool(pairs) == overlap and all(a.backward_first for a in pairs)
        executor = mp.PipelineExecutor(schedule, [SideChunk(0, True)], make_group("pp", [0]))
        results.append(executor.step(mbs, _loss))
    plain, fused = results
    assert [a.label() for a, _, _ in fused.actions] == ["F0", "B0+F1", "B1+F2", "B2+F3", "B3"]
    assert (plain.loss, plain.side_loss) == (fused.loss, fused.side_loss)
    np.testing.assert_array_equal(plain.stats[0][0].asnumpy(), fused.stats[0][0].asnumpy())
    for a, b in zip(plain.grads, fused.grads):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_deferred_weight_gradient_is_the_unsplit_one_bit_for_bit():
    block = Block(5, bias=True)
    x = Tensor(np.random.default_rng(1).standard_normal((6, H)).astype(np.float32))
    params = block.trainable_params()

    def grads():
        out, vjp_fn = ms.vjp(lambda: (block(x) ** 2).sum(), weights=params)
        return out, vjp_fn

    out, vjp_fn = grads()
    autodiff = [g.asnumpy() for g in vjp_fn(ops.ones_like(out))[1]]
    stash = WeightGradStash()
    assert len(defer_weight_grads(block, stash)) == 2
    out, vjp_fn = grads()
    unsplit = [g.asnumpy() for g in vjp_fn(ops.ones_like(out))[1]]
    out, vjp_fn = grads()
    with stash.collect("mb0"):
        split = {p.name: g.asnumpy().copy() for p, g in zip(params, vjp_fn(ops.ones_like(out))[1])}
    assert stash.pending("mb0") == 2
    weights = {p.name for p in params if p.name.endswith("weight")}
    assert all(not split[n].any() for n in weights)                 # deferred: zero in B
    for p, dw in stash.apply("mb0"):
        split[p.name] = split[p.name] + dw.asnumpy()
    for i, p in enumerate(params):
        assert np.array_equal(autodiff[i], unsplit[i]), p.name      # the split rule is MindSpore's backward
        assert np.array_equal(unsplit[i], split[p.name]), p.name    # and deferring changes no bit
    assert len(stash) == 0


def _split_and_unsplit_grads(block, x):
    """(unsplit, split) gradients of (block(x)^2).sum() after `defer_weight_grads`: the split
    ones are B's plus the stash's W (through the leaves' weight pipelines)."""
    params = block.trainable_params()
    stash = WeightGradStash()
    defer_weight_grads(block, stash)

    def run():
        out, vjp_fn = ms.vjp(lambda: (block(x) ** 2).sum(), weights=params)
        return vjp_fn(ops.ones_like(out))[1]

    unsplit = {p.name: g.asnumpy() for p, g in zip(params, run())}
    with stash.collect("mb0"):
        split = {p.name: g.asnumpy().copy() for p, g in zip(params, run())}
    assert stash.pending("mb0") == 2
    for p, dw in stash.apply("mb0"):
        split[p.name] = split[p.name] + dw.asnumpy()
    return unsplit, split


def test_deferred_weight_gradient_goes_through_the_fsdp_reduction():
    """An FSDP leaf's deferred gradient is reduced when W runs, as the unsplit backward reduces it.
    One rank: the reduction is made visible by a gradient division of 2 (what
    disable_gradient_division: false does over two data-parallel ranks)."""
    from mf_parallel.leaf import install, plan_of

    block = Block(3, bias=True)
    x = Tensor(np.random.default_rng(2).standard_normal((6, H)).astype(np.float32))
    out, vjp_fn = ms.vjp(lambda: (block(x) ** 2).sum(), weights=block.trainable_params())
    autodiff = {p.name: g.asnumpy() for p, g in zip(block.trainable_params(), vjp_fn(ops.ones_like(out))[1])}
    mp.fully_shard(block, mp.init_mesh(mp.ParallelDims(1)), reshard_after_forward=False)
    for lin in (block.fc1, block.fc2):
        plan_of(lin).fsdp.divide_by = 2
        install(lin)
    unsplit, split = _split_and_unsplit_grads(block, x)
    for name, want in autodiff.items():
        np.testing.assert_allclose(unsplit[name], want / 2, rtol=1e-6, err_msg=name)
        assert np.array_equal(unsplit[name], split[name]), name


def test_deferred_weight_gradient_of_a_row_parallel_leaf_keeps_its_bias_apart():
    """A row-parallel Linear adds its bias after the output's reduction (plan.deferred): the split
    leaf runs without it, and the bias gradient still arrives in B."""
    from mf_parallel.leaf import ensure_plan, install

    block = Block(4, bias=True)
    x = Tensor(np.random.default_rng(3).standard_normal((6, H)).astype(np.float32))
    out, vjp_fn = ms.vjp(lambda: (block(x) ** 2).sum(), weights=block.trainable_params())
    autodiff = {p.name: g.asnumpy() for p, g in zip(block.trainable_params(), vjp_fn(ops.ones_like(out))[1])}
    ensure_plan(block.fc2).deferred = ("bias",)
    install(block.fc2)
    unsplit, split = _split_and_unsplit_grads(block, x)
    for name, want in autodiff.items():
        np.testing.assert_allclose(unsplit[name], want, rtol=1e-6, atol=1e-7, err_msg=name)
        assert np.array_equal(unsplit[name], split[name]), name


def test_deferral_needs_pynative():
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with pytest.raises(mp.ParallelConfigError, match="needs PyNative mode"):
            defer_weight_grads(Block(0, True), WeightGradStash())
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)


def test_tapes_are_kept_only_for_a_backward_that_follows_at_once():
    one = build_schedule(mp.resolve_pipeline(2), 4)
    # rank 1 (the last stage) runs F B F B ...: every tape kept; rank 0 (F0 F1 B0 F2 B1 F3 B2 B3)
    # differentiates an older forward each time: it recomputes them all
    assert _tapes_kept(one.actions(1)) == {(m, 1) for m in range(4)}
    assert _tapes_kept(one.actions(0)) == set()


def test_executor_checks_its_inputs():
    schedule = build_schedule(PipelineSpec(1, "interleaved_1f1b", 2), 2)
    group = make_group("pp", [0])
    with pytest.raises(mp.ParallelConfigError, match="2 chunk"):
        mp.PipelineExecutor(schedule, [Chunk(0, True)], group)
    executor = mp.PipelineExecutor(schedule, [Chunk(0, True), Chunk(1, False)], group)
    with pytest.raises(mp.ParallelConfigError, match="for 2 micro-batches, got 3"):
        executor.step(_micro_batches(3), _loss)


def test_mindspore_differentiates_only_the_newest_recorded_forward():
    """Why the executor recomputes forwards (executor.py): MindSpore 2.10 PyNative keeps recorded
    forwards as a stack. If an upgrade lifts this, the tapes could wait for their backward."""
    block = Block(2, bias=False)
    params = block.trainable_params()
    xs = [Tensor(np.full((2, H), i + 1.0, np.float32)) for i in range(2)]
    tapes = [ms.vjp(block, x, weights=params) for x in xs]
    with pytest.raises(RuntimeError, match="Can not find top cell for backward"):
        tapes[0][1](ops.ones_like(tapes[0][0]))          # the oldest first: what a pipeline needs
