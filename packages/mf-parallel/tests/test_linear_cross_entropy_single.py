"""LinearCrossEntropy (the output projection fused with the loss) on one process: loss and every
gradient against a numpy transcription of softmax cross entropy, over several chunks (a ragged
last one), PyNative and GRAPH_MODE; a LoRA-shaped second term with a frozen base; the
vocab-parallel arithmetic on a stand-in pair of ranks (the exchange replaced by the two ranks'
real statistics); a planned (FSDP, one rank) leaf's linear terms."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Parameter, Tensor, mint, nn

import mf_parallel as mp
from mf_parallel.loss import LinearCrossEntropy
from mf_parallel.mesh import Group

N, K, V, R = 11, 6, 40, 3
RNG = np.random.default_rng(0)
X = RNG.standard_normal((N, K)).astype(np.float32)
W = (RNG.standard_normal((V, K)) * 0.7).astype(np.float32)
X2 = RNG.standard_normal((N, R)).astype(np.float32)
W2 = (RNG.standard_normal((V, R)) * 0.5).astype(np.float32)
LABELS = RNG.integers(0, V, N).astype(np.int32)
MASK = (RNG.random(N) > 0.25).astype(np.float32)
SCALE = np.float32(0.37)          # the upstream gradient (1 / tokens in the trainer)


def numpy_reference(xs, ws):
    """(loss, [dx_t], [dw_t]) of SCALE * sum(mask * CE(sum_t x_t w_t^T, labels)), float64."""
    z = sum(x.astype(np.float64) @ w.astype(np.float64).T for x, w in zip(xs, ws))
    top = z.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(z - top).sum(-1, keepdims=True)))[:, 0]
    loss = SCALE * (MASK * (lse - z[np.arange(N), LABELS])).sum()
    dz = np.exp(z - lse[:, None])
    dz[np.arange(N), LABELS] -= 1.0
    dz *= (SCALE * MASK)[:, None]
    return loss, [dz @ w for w in ws], [dz.T @ x for x in xs]


@pytest.fixture(autouse=True)
def restore_mode():
    yield
    ms.set_context(mode=ms.PYNATIVE_MODE)


class Scaled(nn.Cell):
    def __init__(self, ce, terms: int, trained=None):
        super().__init__()
        self.ce = ce
        self.terms = terms
        self.trained = trained

    def construct(self, x, w, x2, w2, labels, mask):
        terms = ((x, w),) if self.terms == 1 else ((x, w), (x2, w2))
        return self.ce(terms, labels, mask, self.trained) * SCALE


def run(ce, terms, trained=None):
    cell = Scaled(ce, terms, trained)
    args = [Tensor(a) for a in (X, W, X2, W2, LABELS, MASK)]
    loss, grads = ms.value_and_grad(cell, (0, 1, 2, 3))(*args)
    return float(loss.asnumpy()), [g.asnumpy() for g in grads]


@pytest.mark.parametrize("mode,chunk_rows", [(ms.PYNATIVE_MODE, N), (ms.PYNATIVE_MODE, 1), (ms.GRAPH_MODE, 4)])
def test_loss_and_gradients_match_numpy(mode, chunk_rows):
    ms.set_context(mode=mode)
    loss, (dx, dw, _, _) = run(mp.LinearCrossEntropy(chunk_bytes=4 * V * chunk_rows), 1)
    want_loss, (want_dx,), (want_dw,) = numpy_reference([X], [W])
    assert loss == pytest.approx(want_loss, rel=1e-6)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_a_second_term_and_a_frozen_base(mode):
    """LoRA on the output: logits = x W^T + x2 B^T; the frozen W gets no GEMM, a zero gradient."""
    ms.set_context(mode=mode)
    ce = mp.LinearCrossEntropy(chunk_bytes=4 * V * 4)
    want_loss, want_dx, want_dw = numpy_reference([X, X2], [W, W2])
    for trained in (None, (False, True)):
        loss, (dx, dw, dx2, dw2) = run(ce, 2, trained)
        assert loss == pytest.approx(want_loss, rel=1e-6)
        np.testing.assert_allclose(dx, want_dx[0], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(dx2, want_dx[1], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(dw2, want_dw[1], rtol=1e-5, atol=1e-7)
        if trained is None:
            np.testing.assert_allclose(dw, want_dw[0], rtol=1e-5, atol=1e-7)
        else:
            assert not dw.any()


class _StandInExchange(nn.Cell):
    """The all-gather of the two ranks' statistics: records this rank's, hands back both
    (PyNative: Python between ops)."""

    def __init__(self, book: dict, rank: int):
        super().__init__()
        self.book, self.rank = book, rank

    def construct(self, stats):
        self.book[self.rank] = stats.asnumpy()
        both = [self.book.get(r, np.zeros_like(self.book[self.rank])) for r in (0, 1)]
        return Tensor(np.concatenate(both, 0))


def test_vocab_parallel_arithmetic_on_a_stand_in_pair():
    """Each of two ranks holds half of the vocabulary; the statistics both exchange give every
    rank the one-process loss, its half of dW and its partial dx (the halves' dx add up)."""
    book: dict = {}
    halves = np.split(W, 2, 0)
    cells = []
    for rank in (0, 1):
        group = Group(label="tp", ranks=(0, 1), rank=rank, name="mf_test_never_used", backend="mccl", is_world=False)
        ce = LinearCrossEntropy(group, chunk_bytes=4 * V * N)        # one chunk: one exchange per pass
        ce.exchange = _StandInExchange(book, rank)
        cells.append(Scaled(ce, 1))

    def run_rank(rank):
        args = [Tensor(a) for a in (X, halves[rank], X2, W2, LABELS, MASK)]
        loss, grads = ms.value_and_grad(cells[rank], (0, 1))(*args)
        return float(loss.asnumpy()), [g.asnumpy() for g in grads]

    for rank in (0, 1):                      # first pass: every rank's statistics recorded
        run_rank(rank)
    want_loss, (want_dx,), (want_dw,) = numpy_reference([X], [W])
    dx_sum = 0
    for rank in (0, 1):
        loss, (dx, dw) = run_rank(rank)
        assert loss == pytest.approx(want_loss, rel=1e-6)
        np.testing.assert_allclose(dw, np.split(want_dw, 2, 0)[rank], rtol=1e-5, atol=1e-7)
        dx_sum = dx_sum + dx
    np.testing.assert_allclose(dx_sum, want_dx, rtol=1e-5, atol=1e-7)


class Head(nn.Cell):
    def __init__(self):
        super().__init__()
        self.out = mint.nn.Linear(K, V, bias=False)
        self.out.weight = Parameter(Tensor(W), name="weight")

    def construct(self, x):
        return self.out(x)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
def test_planned_leaf_linear_terms(mode):
    """An FSDP leaf (one rank, resharding) hands its input and gathered weight: the same loss and
    weight gradient as the unplanned one."""
    ms.set_context(mode=mode)
    head = Head()
    mp.fully_shard(head, mp.init_mesh(mp.ParallelDims(1)), reshard_after_forward=True)
    assert mp.linear_terms_problem(head.out) is None

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__()
            self.head = head
            self.ce = mp.LinearCrossEntropy(chunk_bytes=4 * V * 4)

        def construct(self, x, labels, mask):
            return self.ce(self.head.out.linear_terms(x), labels, mask) * SCALE

    loss, grads = ms.value_and_grad(Loss(), None, head.trainable_params())(Tensor(X), Tensor(LABELS), Tensor(MASK))
    want_loss, _, (want_dw,) = numpy_reference([X], [W])
    assert float(loss.asnumpy()) == pytest.approx(want_loss, rel=1e-6)
    np.testing.assert_allclose(grads[0].asnumpy(), want_dw, rtol=1e-5, atol=1e-7)


def test_problems_and_bad_arguments():
    net = nn.Cell()
    net.out = mint.nn.Linear(K, V, bias=True)
    mp.fully_shard(net, mp.init_mesh(mp.ParallelDims(1)))
    assert "bias" in mp.linear_terms_problem(net.out)
    with pytest.raises(mp.ParallelConfigError, match="chunk_bytes must be a positive number of bytes"):
        mp.LinearCrossEntropy(chunk_bytes=0)
