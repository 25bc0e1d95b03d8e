"""AdamW against a numpy transcription of torch.optim.AdamW (single-tensor path), in GRAPH_MODE."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import Parameter, Tensor, nn

from mf_trainer.errors import TrainerConfigError
from mf_trainer.optimizer import AdamW


class ApplyGrads(nn.Cell):
    def __init__(self, opt):
        super().__init__(auto_prefix=False)
        self.opt = opt

    def construct(self, g0, g1, a, b, c):
        return self.opt((g0, g1), Tensor(True), a, b, c)


def _setup(seed=0):
    rng = np.random.RandomState(seed)
    init = [rng.randn(5, 3).astype(np.float32), rng.randn(3).astype(np.float32)]
    params = [Parameter(Tensor(init[0]), "w.weight"), Parameter(Tensor(init[1]), "w.bias")]
    grads = [[rng.randn(5, 3).astype(np.float32) * s, rng.randn(3).astype(np.float32) * s]
             for s in (1.0, 0.1, 3.0, 1e-3, 1.0, 0.5)]
    lrs = [1e-2, 2e-2, 5e-3, 1e-2, 3e-2, 1e-3]
    return init, params, grads, lrs


def _run(opt, cell, grads, lrs):
    for g, lr in zip(grads, lrs):
        cell(Tensor(g[0]), Tensor(g[1]), *opt.scalars(lr))
        opt.step += 1


@pytest.mark.usefixtures("graph_mode")
def test_matches_torch_adamw_reference_in_graph_mode(torch_adamw_reference):
    init, params, grads, lrs = _setup()
    betas, eps, wd, decay = (0.9, 0.95), 1e-8, 0.1, [True, False]
    opt = AdamW(params, betas=betas, eps=eps, weight_decay=wd, decay=decay)
    _run(opt, ApplyGrads(opt), grads, lrs)
    ref_p, ref_m, ref_v = torch_adamw_reference(init, grads, lrs, betas, eps, wd, decay)
    for i in range(2):
        np.testing.assert_allclose(params[i].asnumpy(), ref_p[i], rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(opt.exp_avg[i].asnumpy(), ref_m[i], rtol=2e-6, atol=1e-8)
        np.testing.assert_allclose(opt.exp_avg_sq[i].asnumpy(), ref_v[i], rtol=2e-6, atol=1e-12)
    assert opt.step == len(lrs)
    # The bias is excluded from decay: with decay it would have drifted measurably.
    decayed_p, _, _ = torch_adamw_reference(init, grads, lrs, betas, eps, 10.0, [True, True])
    assert not np.allclose(decayed_p[1], ref_p[1], rtol=1e-4)


@pytest.mark.usefixtures("graph_mode")
def test_state_round_trip_continues_bit_for_bit():
    init, params, grads, lrs = _setup(1)
    opt = AdamW(params, weight_decay=0.01)
    cell = ApplyGrads(opt)
    _run(opt, cell, grads[:3], lrs[:3])
    state = opt.state_dict()
    weights = [p.asnumpy().copy() for p in params]
    _run(opt, cell, grads[3:], lrs[3:])
    expected = [p.asnumpy().copy() for p in params]

    params2 = [Parameter(Tensor(w), n) for w, n in zip(weights, ("w.weight", "w.bias"))]
    opt2 = AdamW(params2, weight_decay=0.01)
    opt2.load_state_dict(state)
    assert opt2.step == 3 and sorted(state) == sorted(["step", *opt2.moment_names()])
    _run(opt2, ApplyGrads(opt2), grads[3:], lrs[3:])
    for a, b in zip(expected, params2):
        assert np.array_equal(a, b.asnumpy())


def test_bad_hyper_parameters_are_config_errors():
    p = [Parameter(Tensor(np.zeros(2, np.float32)), "x")]
    with pytest.raises(TrainerConfigError, match="optimizer.betas"):
        AdamW(p, betas=(0.9, 1.0))
    with pytest.raises(TrainerConfigError, match="optimizer.eps"):
        AdamW(p, eps=0.0)


def test_load_state_rejects_a_wrong_shape():
    opt = AdamW([Parameter(Tensor(np.zeros(2, np.float32)), "x")])
    state = opt.state_dict()
    state["exp_avg.x"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="exp_avg.x"):
        opt.load_state_dict(state)
