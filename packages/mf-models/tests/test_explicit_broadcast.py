"""RMSNorm, RoPE, the attention mask and the attention softmax's gradient broadcast explicitly
(MindSpore 2.10's CPU kernels for a broadcasting Sub/Add/RealDiv keep ~4x their output of memory
for the life of a graph: benchmarks/README.md). The rewrites must be the same math as the
implicitly broadcast forms they replace, values and gradients, in both execution modes."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from mf_models.common.attention import _MASK_VALUE, LastAxisSoftmax
from mf_models.common.layers import RMSNorm, rms_norm_forward
from mf_models.common.rope import apply_rotary, rotate_half

rng = np.random.default_rng(0)


class _WeightedSum(nn.Cell):
    """sum(fn(*inputs) * weights): a scalar whose gradient reaches every output element."""

    def __init__(self, fn, weights):
        super().__init__()
        self.fn = fn
        self.weights = weights

    def construct(self, *inputs):
        return (self.fn(*inputs) * self.weights).sum()


def _grads(fn, *inputs):
    """(fn(*inputs), the gradients of sum(fn(*inputs) * w) for the inputs) in the current mode; w
    depends only on the output's shape, so two functions are compared on the same loss."""
    value = fn(*inputs)
    weights = ms.Tensor(np.random.default_rng(1).standard_normal(value.shape).astype(np.float32))
    grads = ms.grad(_WeightedSum(fn, weights), grad_position=tuple(range(len(inputs))))(*inputs)
    return value.asnumpy(), [g.asnumpy() for g in (grads if isinstance(grads, tuple) else (grads,))]


def _mindspore_softmax(scores):
    return ops.softmax(scores, -1)


@pytest.fixture(params=[ms.PYNATIVE_MODE, ms.GRAPH_MODE], ids=["pynative", "graph"])
def mode(request):
    ms.set_context(mode=request.param)
    yield request.param
    ms.set_context(mode=ms.PYNATIVE_MODE)


def test_softmax_gradient_is_mindspores_own(mode):
    scores = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    scores[0, 1, 2, :] = _MASK_VALUE  # a fully masked row (left padding): uniform probabilities
    scores[1, 0, :, 4:] = _MASK_VALUE
    x = ms.Tensor(scores)
    ours, (d_ours,) = _grads(LastAxisSoftmax(), x)
    theirs, (d_theirs,) = _grads(_mindspore_softmax, x)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_allclose(d_ours, d_theirs, rtol=1e-6, atol=1e-7)
    assert np.isfinite(d_ours).all()


def test_rms_norm_matches_the_broadcast_formula(mode):
    norm = RMSNorm(6, eps=1e-6)
    weight = ms.Tensor(rng.standard_normal(6).astype(np.float32))
    x = ms.Tensor(rng.standard_normal((2, 4, 6)).astype(np.float32))

    def ours(weight, x):
        return rms_norm_forward(norm, weight, x)

    def reference(weight, x):
        return weight * (x * ops.rsqrt((x * x).mean(-1, keep_dims=True) + 1e-6))

    value, grads = _grads(ours, weight, x)
    ref_value, ref_grads = _grads(reference, weight, x)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6, atol=1e-7)
    for a, b in zip(grads, ref_grads):  # d weight (summed over the broadcast axes), d x
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_rotary_matches_the_broadcast_formula(mode):
    x = ms.Tensor(rng.standard_normal((2, 3, 5, 8)).astype(np.float32))
    cos = ms.Tensor(rng.standard_normal((2, 5, 8)).astype(np.float32))
    sin = ms.Tensor(rng.standard_normal((2, 5, 8)).astype(np.float32))

    def reference(x, cos, sin):
        return x * ops.expand_dims(cos, 1) + rotate_half(x) * ops.expand_dims(sin, 1)

    ours, d_ours = _grads(apply_rotary, x, cos, sin)
    theirs, d_theirs = _grads(reference, x, cos, sin)
    np.testing.assert_array_equal(ours, theirs)
    for a, b in zip(d_ours, d_theirs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
