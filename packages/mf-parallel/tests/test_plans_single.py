"""Plans on one rank: transformed models compute exactly what the original computes (PyNative and
GRAPH_MODE), keep their parameter names, and reject bad plans with one clear line. TP reslicing is
checked on a stand-in two-rank group (construction only: nothing is communicated)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, mint, nn, ops

import mf_parallel as mp
from mf_parallel.mesh import Group


def norm_forward(cell, weight, x):
    return x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + cell.eps) * weight


class Norm(nn.Cell):
    def __init__(self, dim):
        super().__init__()
        self.eps = 1e-6
        self.weight = Parameter(Tensor(np.linspace(0.5, 1.5, dim).astype(np.float32)), name="weight")

    def construct(self, x):
        return norm_forward(self, self.weight, x)


mp.register_param_forward(Norm, ("weight",), norm_forward)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.norm = Norm(8)
        self.up = mint.nn.Linear(8, 6)
        self.down = mint.nn.Linear(6, 8, bias=True)
        self.out = nn.Dense(8, 16, has_bias=False)

    def construct(self, ids):
        h = self.norm(self.emb(ids))
        h = h + self.down(ops.tanh(self.up(h)))
        return self.out(h)


def fresh(seed=0) -> Net:
    net = Net()
    rng = np.random.default_rng(seed)
    for _, p in net.parameters_and_names():
        p.set_data(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.5))
    return net


class Loss(nn.Cell):
    def __init__(self, net, tp_group):
        super().__init__()
        self.net = net
        self.ce = mp.VocabParallelCrossEntropy(tp_group)

    def construct(self, ids, labels):
        return self.ce(self.net(ids), labels).mean()


@pytest.fixture(scope="module")
def mesh():
    return mp.init_mesh(mp.ParallelDims(1))


@pytest.fixture(autouse=True)
def restore_mode():
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


IDS = Tensor(np.random.default_rng(1).integers(0, 16, (2, 5)).astype(np.int32))
LABELS = Tensor(np.random.default_rng(2).integers(0, 16, (2, 5)).astype(np.int32))


def loss_and_grads(net, mesh):
    loss = Loss(net, mesh["tp"])
    value, grads = ms.value_and_grad(loss, None, loss.trainable_params())(IDS, LABELS)
    return float(value.asnumpy()), [g.asnumpy() for g in grads]


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
@pytest.mark.parametrize("reshard", [True, False])
def test_planned_model_matches_original(mesh, mode, reshard):
    ms.set_context(mode=mode)
    want_loss, want_grads = loss_and_grads(fresh(), mesh)
    net = fresh()
    names = [n for n, _ in net.parameters_and_names()]
    mp.parallelize_module(net, mesh["tp"], {"emb": mp.VocabParallelEmbedding(), "norm": mp.SequenceParallel(),
                                            "up": mp.ColwiseParallel(), "down": mp.RowwiseParallel()})
    mp.fully_shard(net, mesh, reshard_after_forward=reshard)
    assert [n for n, _ in net.parameters_and_names()] == names
    got_loss, got_grads = loss_and_grads(net, mesh)
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    for got, want in zip(got_grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_vocab_parallel_loss_matches_mindspore_sparse_ce(mesh):
    logits = Tensor(np.random.default_rng(3).standard_normal((6, 16)).astype(np.float32) * 3)
    labels = Tensor(np.array([0, 5, 15, 3, 3, 9], np.int32))
    ours = mp.VocabParallelCrossEntropy(mesh["tp"])(logits, labels).asnumpy()
    ref = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="none")(logits, labels).asnumpy()
    np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_vocab_parallel_argmax_is_argmax_with_first_index_on_ties(mesh):
    logits = np.random.default_rng(4).standard_normal((2, 3, 16)).astype(np.float32)
    logits[0, 1, [2, 9]] = 50.0                       # a tie: argmax takes the first index
    logits[1, 2, [7, 15]] = 50.0
    ours = mp.VocabParallelArgmax(mesh["tp"])(Tensor(logits)).asnumpy()
    assert ours.dtype == np.int32 and ours.shape == (2, 3)
    np.testing.assert_array_equal(ours, logits.argmax(-1))
    assert ours[0, 1] == 2 and ours[1, 2] == 7


def test_unregistered_leaf_is_a_clear_error(mesh):
    class Scale(nn.Cell):
        def __init__(self):
            super().__init__()
            self.s = Parameter(Tensor(np.ones(3, np.float32)), name="s")

        def construct(self, x):
            return x * self.s

    with pytest.raises(mp.ParallelConfigError, match=r"Scale owns parameters \['s'\] but has no parameter forward; "
                                                      r"register one with mf_parallel.register_param_forward"):
        mp.fully_shard(Scale(), mesh)
    with pytest.raises(mp.ParallelConfigError, match="is not a mindspore.nn.Cell subclass"):
        mp.register_param_forward(int, ("x",), lambda c, x: x)


def test_plan_paths_are_checked(mesh):
    net = fresh()
    with pytest.raises(mp.ParallelConfigError, match=r"no sub-Cell at 'layers.0.up' \(did you mean up\?\)"):
        mp.parallelize_module(net, mesh["tp"], {"layers.0.up": mp.ColwiseParallel()})
    with pytest.raises(mp.ParallelConfigError, match="maps to 'colwise', not a ParallelStyle"):
        mp.parallelize_module(net, mesh["tp"], {"up": "colwise"})
    with pytest.raises(mp.ParallelConfigError, match="ColwiseParallel.input_layout: must be one of"):
        mp.ColwiseParallel(input_layout="sharded")
    with pytest.raises(mp.ParallelConfigError, match="ColwiseParallel.regather_input: needs input_layout 'shard_seq'"):
        mp.ColwiseParallel(input_layout="gathered", regather_input=True)


# ----------------------------------------------------------------------------- FSDP options
def test_reshard_policies():
    assert mp.reshard_after_forward_for("always", pp_enabled=True, last=True) is True
    assert mp.reshard_after_forward_for("never") is False
    assert mp.reshard_after_forward_for("default") is True
    assert mp.reshard_after_forward_for("default", last=True) is False
    assert mp.reshard_after_forward_for("default", pp_enabled=True) is False
    with pytest.raises(mp.ParallelConfigError, match="reshard_after_forward_policy: must be one of always, never, "
                                                     "default, got 'sometimes'"):
        mp.reshard_after_forward_for("sometimes")


def test_cpu_offload_is_rejected_with_the_reason(mesh):
    mp.check_cpu_offload(False)
    with pytest.raises(mp.ParallelConfigError, match="means nothing on device_target CPU"):
        mp.fully_shard(fresh(), mesh, cpu_offload=True)
    with pytest.raises(mp.ParallelConfigError, match="not supported by mf-parallel on Ascend yet"):
        mp.check_cpu_offload(True, "Ascend")
    with pytest.raises(mp.ParallelConfigError, match="cpu_offload: must be true or false, got 'yes'"):
        mp.check_cpu_offload("yes")


def test_fully_shard_argument_types(mesh):
    with pytest.raises(mp.ParallelConfigError, match="disable_gradient_division: must be true or false"):
        mp.fully_shard(fresh(), mesh, disable_gradient_division="sum")
    with pytest.raises(mp.ParallelConfigError, match="reshard_after_forward must be a bool"):
        mp.fully_shard(fresh(), mesh, reshard_after_forward="always")


# ----------------------------------------------------------------------------- clipping and state
def test_global_norm_clip_on_one_rank(mesh):
    net = fresh()
    params = net.trainable_params()
    grads = tuple(Tensor(np.full(p.shape, 0.1 * (i + 1), np.float32)) for i, p in enumerate(params))
    norm_want = np.sqrt(sum(float((g.asnumpy() ** 2).sum()) for g in grads))
    clipped, norm = mp.GlobalNormClip(net, params, mesh, 1.0)(grads)
    assert float(norm.asnumpy()) == pytest.approx(norm_want, rel=1e-6)
    scale = 1.0 / (norm_want + 1e-6)
    for c, g in zip(clipped, grads):
        np.testing.assert_allclose(c.asnumpy(), g.asnumpy() * scale, rtol=1e-6)
    with pytest.raises(mp.ParallelConfigError, match="training.max_norm: gradient clipping needs a positive number"):
        mp.GlobalNormClip(net, params, mesh, 0)
    # A parameter another rank counts (a pipeline stage's copy of a tied table) is left out.
    _, norm = mp.GlobalNormClip(net, params, mesh, 1.0, counted_elsewhere=[params[0]])(grads)
    rest = np.sqrt(sum(float((g.asnumpy() ** 2).sum()) for g in grads[1:]))
    assert float(norm.asnumpy()) == pytest.approx(rest, rel=1e-6) and rest < norm_want
    # Per-parameter norms: each at its position, -1 (a parameter only another stage holds) as 0,
    # and a parameter counted elsewhere as 0 on this rank.
    clip = mp.GlobalNormClip(net, params, mesh, 1.0, counted_elsewhere=[params[0]])
    got = clip.parameter_norms(grads, (1, -1, 0, len(params) - 1)).asnumpy()
    want = [np.linalg.norm(grads[i].asnumpy().astype(np.float64)) for i in (1, len(params) - 1)]
    np.testing.assert_allclose(got, [want[0], 0.0, 0.0, want[1]], rtol=1e-6)


def test_state_roundtrip_on_one_rank(mesh):
    net = fresh()
    mp.fully_shard(net, mesh)
    state = mp.gather_full_state(net, mesh)
    other = fresh(seed=5)
    mp.fully_shard(other, mesh)
    mp.load_full_state(other, mesh, state)
    for name, value in mp.gather_full_state(other, mesh).items():
        np.testing.assert_array_equal(value, state[name])
    layouts = mp.param_layouts(net, mesh)
    assert layouts["up.weight"].global_shape == (6, 8) and layouts["up.weight"].replica_id == 0
    blocks = mp.local_blocks(net, mesh)
    assert set(blocks) == set(state) and all(np.array_equal(blocks[k], state[k]) for k in state)
    assert mp.shard_metadata(net, mesh)["up.weight"] == {"global_shape": [6, 8], "offset": [0, 0], "shape": [6, 8],
                                                        "replica_id": 0, "sharded_axes": ["pp"]}
    bad = dict(state, **{"up.weight": np.zeros((3, 8), np.float32)})
    with pytest.raises(mp.ParallelConfigError, match=r"up.weight has shape \[3, 8\], the model expects \[6, 8\]"):
        mp.load_full_state(other, mesh, bad)
    with pytest.raises(mp.ParallelConfigError, match=r"no value for \['down.bias'\]"):
        mp.load_full_state(other, mesh, {k: v for k, v in state.items() if k != "down.bias"})


def test_communicator_on_one_rank():
    comm = mp.Communicator()
    assert (comm.rank, comm.world_size) == (0, 1)
    obj = {"a": [1, 2]}
    got = comm.all_gather_object(obj)
    assert got == [obj] and got[0] is not obj
    comm.barrier()


# ----------------------------------------------------------------------------- TP reslicing
def _fake_tp(rank: int) -> Group:
    """Rank `rank` of a two-rank group: lets the styles reslice without communicating."""
    return Group(label="tp", ranks=(0, 1), rank=rank, name="mf_test_never_used", backend="mccl", is_world=False)


@pytest.mark.parametrize("rank", [0, 1])
def test_tp_styles_keep_this_ranks_slice(rank):
    net = fresh()
    full = {n: p.asnumpy().copy() for n, p in net.parameters_and_names()}
    mp.parallelize_module(net, _fake_tp(rank), {
        "emb": mp.VocabParallelEmbedding(), "norm": mp.SequenceParallel(), "up": mp.ColwiseParallel(),
        "down": mp.RowwiseParallel(), "out": mp.ColwiseParallel(input_layout="shard_seq")})
    got = {n: p.asnumpy() for n, p in net.parameters_and_names()}
    rows = lambda a: np.split(a, 2, 0)[rank]  # noqa: E731
    np.testing.assert_array_equal(got["emb.embedding_table"], rows(full["emb.embedding_table"]))
    np.testing.assert_array_equal(got["up.weight"], rows(full["up.weight"]))
    np.testing.assert_array_equal(got["up.bias"], rows(full["up.bias"]))
    np.testing.assert_array_equal(got["down.weight"], np.split(full["down.weight"], 2, 1)[rank])
    np.testing.assert_array_equal(got["down.bias"], full["down.bias"])       # added after the reduction
    np.testing.assert_array_equal(got["norm.weight"], full["norm.weight"])   # replicated, gradient synced
    np.testing.assert_array_equal(got["out.weight"], rows(full["out.weight"]))
    assert net.emb.mf_vocab_start == 8 * rank


def test_tp_errors():
    net = fresh()
    with pytest.raises(mp.ParallelConfigError, match=r"ColwiseParallel\(up\): weight of shape \[6, 8\] cannot be split 4 ways along "
                                                     r"axis 0; choose a tensor_parallel that divides 6"):
        mp.parallelize_module(net, Group("tp", (0, 1, 2, 3), 0, "x", "mccl", False), {"up": mp.ColwiseParallel()})
    net = fresh()
    mp.fully_shard(net, mp.init_mesh(mp.ParallelDims(1)))
    with pytest.raises(mp.ParallelConfigError, match="apply tensor parallelism before fully_shard"):
        mp.parallelize_module(net, _fake_tp(0), {"up": mp.ColwiseParallel()})
    net = fresh()
    mp.PrepareModuleInput().apply(net, _fake_tp(0), "")
    with pytest.raises(mp.ParallelConfigError, match="applied twice"):
        mp.PrepareModuleInput().apply(net, _fake_tp(0), "")
    assert mp.local_heads(8, 2) == 4
    with pytest.raises(mp.ParallelConfigError, match="tensor_parallel: 3 does not divide 8 heads"):
        mp.local_heads(8, 3)


def test_deferred_gradient_syncs_on_a_stand_in_pair():
    """defer_gradient_syncs: the tp-replicated weights (the norm, the row-parallel bias) lose their
    per-parameter all-reduce and are listed for the step's one bucketed all-reduce, aligned with the
    parameter order the step is given (construction only: nothing is communicated)."""
    from mf_parallel.grad_sync import DeferredSync

    net = fresh()
    mp.parallelize_module(net, _fake_tp(0), {"emb": mp.VocabParallelEmbedding(), "norm": mp.SequenceParallel(),
                                             "up": mp.ColwiseParallel(), "down": mp.RowwiseParallel()})
    record = mp.defer_gradient_syncs(net)
    assert sorted(p.name for p in record.members["tp"]) == ["down.bias", "norm.weight"]
    assert isinstance(net.norm.mf_core.pipes[0].sync, DeferredSync)
    assert mp.defer_gradient_syncs(net).count == 2                  # idempotent
    params = net.trainable_params()
    sync = record.cell(params)
    assert sync.positions == (tuple(i for i, p in enumerate(params) if p.name in ("norm.weight", "down.bias")),)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_gradient_sync_puts_every_bucket_entry_back_in_place(mesh, mode):
    """A bucket in another order than the gradients (a pipeline stage's optimizer order): each
    entry comes back where it was (a one-rank group: the all-reduce is the identity)."""
    from mf_parallel.grad_sync import GradientSync

    ms.set_context(mode=mode)
    grads = tuple(Tensor(np.arange(n, dtype=np.float32).reshape(shape) + 10 * n)
                  for n, shape in ((2, (2,)), (6, (2, 3)), (4, (4,)), (3, (3, 1))))
    out = GradientSync([(mesh["tp"], (3, 1)), (mesh["world"], (2, 0))])(grads)
    for got, want in zip(out, grads):
        np.testing.assert_array_equal(got.asnumpy(), want.asnumpy())


def test_gradient_sync_compiles_a_model_sized_gradient_tuple(mesh):
    """Compiled with as many gradients as the README's tiny demo under TP2 (42, 9 of them deferred,
    spread over the tuple): unrolled, a loop over the bucket inside the loop over the gradients
    passed GRAPH_MODE's call depth limit (1000) and the step failed to compile."""
    from mf_parallel.grad_sync import GradientSync

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        grads = tuple(Tensor(np.full((2, 3), i, np.float32)) for i in range(42))
        bucket = (40, 1, 5, 9, 13, 22, 30, 31, 35)
        out = GradientSync([(mesh["tp"], bucket)])(grads)
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert [float(g.asnumpy()[0, 0]) for g in out] == list(range(42))
