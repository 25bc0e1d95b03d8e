"""Muon: Newton-Schulz and the whole update against float64 numpy, the parameter grouping on the
tiny llama, the pass-through keys, and the skipped step."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

from mf_trainer.errors import TrainerConfigError
from mf_trainer.muon import MatrixShard, Muon, newton_schulz
from mf_trainer.optimizer_options import NS_COEFFICIENTS, MuonOptions, muon_mask, optimizer_options


def ns_reference(u: np.ndarray, steps: int = 5, coefficients=NS_COEFFICIENTS) -> np.ndarray:
    """Keller Jordan's quintic Newton-Schulz, written out in float64 numpy."""
    a, b, c = coefficients
    x = u.astype(np.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (np.linalg.norm(x) + 1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class _NS(nn.Cell):
    def __init__(self, steps, transpose):
        super().__init__()
        self.steps, self.transpose = steps, transpose

    def construct(self, x):
        return newton_schulz(x, self.steps, NS_COEFFICIENTS, self.transpose)


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
@pytest.mark.parametrize("shape", [(12, 30), (30, 12), (16, 16)])
def test_newton_schulz_matches_float64_numpy(mode, shape):
    ms.set_context(mode=mode)
    try:
        rng = np.random.RandomState(sum(shape))
        u = rng.randn(*shape).astype(np.float32)
        ref = ns_reference(u)
        got = _NS(5, shape[0] > shape[1])(ms.Tensor(u)).asnumpy()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=2e-6)
    # What NS is for: the singular values of the reference land near 1 (Keller Jordan: about
    # [0.7, 1.2] after 5 steps), whatever the spread of U's.
    sv = np.linalg.svd(ref, compute_uv=False)
    assert 0.6 < sv.min() and sv.max() < 1.25, sv
    assert np.linalg.svd(u.astype(np.float64), compute_uv=False).max() > 5   # U was far from orthogonal


def muon_reference(params, grads_per_step, lrs, use_muon, decay, options: MuonOptions, betas=(0.9, 0.95), eps=1e-8,
                   weight_decay=0.1):
    """The whole optimizer in float64 numpy: Muon (Moonlight's form) for use_muon, torch AdamW else."""
    params = [p.astype(np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2 = betas
    mu = options.momentum
    for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
        for i, g in enumerate(grads):
            g = g.astype(np.float64)
            if decay[i]:
                params[i] = params[i] * (1 - lr * weight_decay)
            if use_muon[i]:
                m[i] = mu * m[i] + g
                u = g + mu * m[i] if options.nesterov else m[i]
                rows, cols = u.shape
                params[i] = params[i] - lr * options.update_scale(rows, cols) * ns_reference(
                    u, options.ns_steps, options.ns_coefficients)
            else:
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                denom = np.sqrt(v[i] / (1 - b2 ** t)) + eps
                params[i] = params[i] - lr / (1 - b1 ** t) * m[i] / denom
    return params, m


def _params(rng):
    shapes = {"tok_embeddings.weight": (20, 12), "wide.weight": (12, 30), "tall.weight": (30, 12),
              "norm.weight": (12,), "tall.bias": (30,)}
    return [ms.Parameter(ms.Tensor(rng.randn(*s).astype(np.float32) * 0.1), name=n) for n, s in shapes.items()]


@pytest.mark.parametrize("mode", [ms.PYNATIVE_MODE, ms.GRAPH_MODE])
@pytest.mark.parametrize("options", [MuonOptions(), MuonOptions(nesterov=False, adjust_lr_fn="original", ns_steps=3)],
                         ids=["moonlight-defaults", "plain-momentum-original-scale"])
def test_update_matches_float64_numpy_over_steps(mode, options):
    rng = np.random.RandomState(3)
    params = _params(rng)
    names = [p.name for p in params]
    use = muon_mask(names, [p.shape for p in params])
    assert use == [False, True, True, False, False]
    decay = [not n.startswith("norm") and not n.endswith("bias") for n in names]
    init = [p.asnumpy().copy() for p in params]
    shards = [MatrixShard(*p.shape) for p, u in zip(params, use) if u]
    opt = Muon(params, use, options, shards, weight_decay=0.1, decay=decay)
    grads = [[rng.randn(*p.shape).astype(np.float32) for p in params] for _ in range(4)]
    lrs = [1e-2, 2e-2, 2e-2, 5e-3]
    ms.set_context(mode=mode)
    try:
        apply = ms.Tensor(True)
        for step_grads, lr in zip(grads, lrs):
            opt(tuple(ms.Tensor(g) for g in step_grads), apply, *opt.scalars(lr))
            opt.step += 1
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    want, momentum = muon_reference(init, grads, lrs, use, decay, options)
    for p, w in zip(params, want):
        np.testing.assert_allclose(p.asnumpy(), w, rtol=1e-5, atol=1e-6, err_msg=p.name)
    state = opt.state_dict()
    for i, name in enumerate(names):
        if use[i]:
            np.testing.assert_allclose(state[f"momentum.{name}"], momentum[i], rtol=1e-5, atol=1e-6)
            assert f"exp_avg.{name}" not in state
        else:
            assert f"exp_avg.{name}" in state and f"momentum.{name}" not in state
    assert sorted(k for k, _ in opt.moment_owners()) == sorted(k for k in state if k != "step")


def test_update_scale_matches_moonlight_and_keller_jordan():
    assert MuonOptions().update_scale(64, 256) == pytest.approx(0.2 * 16)
    assert MuonOptions(matched_adamw_rms=0.3).update_scale(256, 64) == pytest.approx(0.3 * 16)
    assert MuonOptions(adjust_lr_fn="original").update_scale(256, 64) == pytest.approx(2.0)
    assert MuonOptions(adjust_lr_fn="original").update_scale(64, 256) == 1.0
    # The point of RMS matching: the scaled update of any shape has RMS ~ 0.2 like AdamW's.
    o = ns_reference(np.random.RandomState(0).randn(64, 256))
    assert math.sqrt(float(((o * MuonOptions().update_scale(64, 256)) ** 2).mean())) == pytest.approx(0.2, rel=0.25)


def test_skipped_step_changes_nothing():
    rng = np.random.RandomState(4)
    params = _params(rng)
    use = muon_mask([p.name for p in params], [p.shape for p in params])
    opt = Muon(params, use, MuonOptions(), [MatrixShard(*p.shape) for p, u in zip(params, use) if u])
    opt(tuple(ms.Tensor(rng.randn(*p.shape).astype(np.float32)) for p in params), ms.Tensor(True), *opt.scalars(1e-2))
    opt.step += 1
    before = {**{p.name: p.asnumpy().copy() for p in params}, **opt.state_dict()}
    zeros = tuple(ops.zeros(p.shape, ms.float32) for p in params)   # what the step passes when non-finite
    opt(zeros, ms.Tensor(False), *opt.scalars(1e-2))
    after = {**{p.name: p.asnumpy() for p in params}, **opt.state_dict()}
    assert all(np.array_equal(before[k], after[k]) for k in before if k != "step")


def test_state_dict_round_trip_and_damaged_state():
    rng = np.random.RandomState(5)
    params = _params(rng)
    use = muon_mask([p.name for p in params], [p.shape for p in params])
    opt = Muon(params, use, MuonOptions(), [MatrixShard(*p.shape) for p, u in zip(params, use) if u])
    opt(tuple(ms.Tensor(rng.randn(*p.shape).astype(np.float32)) for p in params), ms.Tensor(True), *opt.scalars(1e-2))
    opt.step += 1
    state = opt.state_dict()
    other = Muon(_params(rng), use, MuonOptions(), [MatrixShard(*p.shape) for p, u in zip(params, use) if u])
    other.load_state_dict(state)
    assert other.step == 1 and all(np.array_equal(other.state_dict()[k], v) for k, v in state.items() if k != "step")
    broken = {k: v for k, v in state.items() if k != "momentum.wide.weight"}
    with pytest.raises(KeyError, match="momentum.wide.weight"):
        other.load_state_dict(broken)
    with pytest.raises(ValueError, match="momentum.tall.weight"):
        other.load_state_dict({**state, "momentum.tall.weight": np.zeros((2, 2), np.float32)})


def test_grouping_on_the_tiny_llama():
    """Muon gets the attention and MLP matrices; the embedding (tied head), norms and biases AdamW."""
    import mf_models

    model = mf_models.build_model({"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
                                   "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                   "num_key_value_heads": 2, "max_position_embeddings": 32,
                                   "attention_bias": True, "tie_word_embeddings": False}, seed=0)
    named = [(p.name, tuple(p.shape)) for p in model.trainable_params()]
    names, shapes = zip(*named)
    use = dict(zip(names, muon_mask(names, shapes)))
    muon = sorted(n for n, u in use.items() if u)
    want = sorted(f"layers.{i}.{m}.weight" for i in range(2)
                  for m in ("attention.wq", "attention.wk", "attention.wv", "attention.wo",
                            "feed_forward.w1", "feed_forward.w2", "feed_forward.w3"))
    assert muon == want
    for adam in ("tok_embeddings.weight", "output.weight", "norm.weight", "layers.0.attention_norm.weight",
                 "layers.1.attention.wq.bias"):
        assert use[adam] is False, adam
    moved = dict(zip(names, muon_mask(names, shapes, [r"feed_forward\.w2"])))
    assert not moved["layers.0.feed_forward.w2.weight"] and moved["layers.0.feed_forward.w1.weight"]
    with pytest.raises(TrainerConfigError, match=r"optimizer.adamw_params: pattern 'fead_forward' matches no"):
        muon_mask(names, shapes, ["fead_forward"])


class _Opt:
    def __init__(self, **extra):
        self.type = "Muon"
        self.extra = extra


@pytest.mark.parametrize("extra, line", [
    ({"momentum": 1.0}, "optimizer.momentum: must be in [0, 1), got 1.0"),
    ({"nesterov": "yes"}, "optimizer.nesterov: must be true or false, got 'yes'"),
    ({"ns_steps": 0}, "optimizer.ns_steps: must be between 1 and 20, got 0"),
    ({"ns_steps": 2.5}, "optimizer.ns_steps: must be an integer, got 2.5"),
    ({"ns_coefficients": [1, 2]}, "optimizer.ns_coefficients: must be three numbers"),
    ({"ns_coefficients": [1, -2, 0.5]}, "optimizer.ns_coefficients: a + b + c must be positive"),
    ({"adjust_lr_fn": "spectral"}, "optimizer.adjust_lr_fn: must be one of match_rms_adamw, original"),
    ({"adjust_lr_fn": "original", "matched_adamw_rms": 0.3}, "optimizer.matched_adamw_rms: acts only with"),
    ({"matched_adamw_rms": 0}, "optimizer.matched_adamw_rms: must be positive"),
    ({"adamw_params": "embed"}, "optimizer.adamw_params: must be a list of regular expressions"),
    ({"adamw_params": ["("]}, "optimizer.adamw_params[0]: not a valid regular expression"),
    ({"adamw_betas": [0.9, 0.95]}, "optimizer.adamw_betas: not a Muon key here; use optimizer.betas"),
    ({"qk_clip_threshold": 100}, "optimizer.qk_clip_threshold: MuonClip's QK-clip"),
    ({"nesterof": True}, "optimizer.nesterof: Muon takes no such key (did you mean 'nesterov'?)"),
])
def test_pass_through_keys_are_checked(extra, line):
    with pytest.raises(TrainerConfigError) as err:
        optimizer_options(_Opt(**extra))
    assert str(err.value).startswith(line), str(err.value)


def test_pass_through_keys_are_read():
    got = optimizer_options(_Opt(momentum=0.9, nesterov=False, ns_steps=6, ns_coefficients=[2, -1.5, 0.5],
                                 matched_adamw_rms=0.3, adamw_params=["wo"]))
    assert got == MuonOptions(momentum=0.9, nesterov=False, ns_steps=6, ns_coefficients=(2.0, -1.5, 0.5),
                              matched_adamw_rms=0.3, adamw_params=("wo",))
    assert optimizer_options(_Opt()) == MuonOptions()
