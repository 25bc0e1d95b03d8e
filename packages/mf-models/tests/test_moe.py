"""The MoE layer against float64 numpy transcriptions of transformers' routers and per-expert loops
(DeepseekV3MoE, MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock), and the dropless dispatch against
the dense-masked reference (values and gradients, any routing, any block height)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from mf_models.common.dispatch import LocalDispatcher, max_blocks
from mf_models.common.moe import MoE, experts_dense_reference
from mf_models.common.router import RouterSpec


def silu(x):
    return x / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_route(x, p, spec: RouterSpec):
    """transformers' routing, float64: (topk_idx [T, k], weights [T, k])."""
    t, e = x.shape[0], spec.num_experts
    logits = x @ p["gate"].T
    scores = 1 / (1 + np.exp(-logits)) if spec.score_func == "sigmoid" else softmax(logits)
    choice = scores + p.get("bias", 0.0)
    if spec.n_group > 1:
        groups = choice.reshape(t, spec.n_group, e // spec.n_group)
        group_scores = np.sort(groups, -1)[..., -2:].sum(-1)
        chosen = np.argsort(-group_scores, -1, kind="stable")[:, :spec.topk_group]
        mask = np.zeros((t, spec.n_group))
        np.put_along_axis(mask, chosen, 1.0, -1)
        choice = np.where(np.repeat(mask, e // spec.n_group, -1) > 0, choice, 0.0)
    idx = np.argsort(-choice, -1, kind="stable")[:, :spec.top_k]
    weights = np.take_along_axis(scores, idx, -1)
    if spec.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdims=True) + spec.norm_eps)
    return idx, weights * spec.routed_scaling_factor


def ref_experts(x, p, idx, weights):
    """HF's per-expert loop: index_add of weight * expert(x) for each chosen expert."""
    out = np.zeros_like(x)
    for expert in range(p["w1"].shape[0]):
        tok, slot = np.nonzero(idx == expert)
        h = silu(x[tok] @ p["w1"][expert].T) * (x[tok] @ p["w3"][expert].T)
        np.add.at(out, tok, weights[tok, slot, None] * (h @ p["w2"][expert].T))
    return out


def params(rng, h, i, e, shared: bool, bias: bool):
    p = {"gate": rng.normal(0, 0.5, (e, h)), "w1": rng.normal(0, 0.3, (e, i, h)),
         "w2": rng.normal(0, 0.3, (e, h, i)), "w3": rng.normal(0, 0.3, (e, i, h))}
    if bias:
        p["bias"] = rng.uniform(0, 0.3, e)
    if shared:
        p.update(s1=rng.normal(0, 0.3, (i, h)), s2=rng.normal(0, 0.3, (h, i)), s3=rng.normal(0, 0.3, (i, h)))
    return {k: v.astype(np.float32) for k, v in p.items()}


def build(p, spec, h, i, shared: bool, balance: bool = False):
    moe = MoE(h, i, spec, i if shared else 0, balance)
    moe.router.gate.weight.set_data(ms.Tensor(p["gate"]))
    if spec.expert_bias:
        moe.router.expert_bias.set_data(ms.Tensor(p["bias"]))
    for name in ("w1", "w2", "w3"):
        getattr(moe.experts, name).set_data(ms.Tensor(p[name]))
        if shared:
            getattr(moe.shared_experts, name).weight.set_data(ms.Tensor(p["s" + name[1]]))
    return moe


ROUTERS = {
    # DeepSeek-V3: sigmoid, score-correction bias, group-limited top-k, normalised, scaled, shared expert
    "deepseek-groups": (RouterSpec(8, 2, "sigmoid", True, 2, 1, True, 1e-20, 2.5), True),
    "deepseek-nogroup-nonorm": (RouterSpec(8, 2, "sigmoid", True, 1, 1, False, 1e-20, 2.5), True),
    "deepseek-4groups": (RouterSpec(8, 2, "sigmoid", True, 4, 2, True, 1e-20, 2.5), True),
    # Mixtral: softmax, top-k renormalised, no shared expert
    "mixtral": (RouterSpec(6, 2, "softmax", norm_topk_prob=True), False),
    # Qwen3-MoE: softmax, top-k not renormalised (norm_topk_prob false) or renormalised
    "qwen3_moe": (RouterSpec(8, 3, "softmax"), False),
    "qwen3_moe-norm": (RouterSpec(8, 3, "softmax", norm_topk_prob=True), False),
}


@pytest.mark.parametrize("case", list(ROUTERS))
def test_moe_matches_transformers_routing_and_experts(case):
    spec, shared = ROUTERS[case]
    h, i = 16, 8
    rng = np.random.default_rng(len(case))
    p = params(rng, h, i, spec.num_experts, shared, spec.expert_bias)
    moe = build(p, spec, h, i, shared)
    x = rng.normal(0, 1, (2, 5, h)).astype(np.float32)
    x64 = x.reshape(10, h).astype(np.float64)
    p64 = {k: v.astype(np.float64) for k, v in p.items()}
    idx, weights = ref_route(x64, p64, spec)
    expected = ref_experts(x64, p64, idx, weights)
    if shared:
        expected += (silu(x64 @ p64["s1"].T) * (x64 @ p64["s3"].T)) @ p64["s2"].T
    got_idx, got_w, _, _ = moe.router(ms.Tensor(x.reshape(10, h)))
    np.testing.assert_array_equal(np.sort(got_idx.asnumpy(), -1), np.sort(idx, -1))
    np.testing.assert_allclose(np.take_along_axis(got_w.asnumpy(), np.argsort(got_idx.asnumpy(), -1), -1),
                               np.take_along_axis(weights, np.argsort(idx, -1), -1), rtol=1e-5, atol=1e-6)
    out, load, counts, _, _ = moe(ms.Tensor(x))
    np.testing.assert_allclose(out.asnumpy().reshape(10, h), expected, atol=2e-5)
    np.testing.assert_array_equal(load.asnumpy(), np.bincount(idx.ravel(), minlength=spec.num_experts))
    assert counts.asnumpy()[0] == 0  # dropless
    if spec.expert_bias and spec.n_group == 1:  # the bias moved some selections (so it is really used)
        raw = np.argsort(-(x64 @ p64["gate"].T), -1)[:, :spec.top_k]
        assert any(set(a) != set(b) for a, b in zip(idx, raw))


def _dispatch_and_dense(x, idx, w, p, block):
    dispatcher = LocalDispatcher(p["w1"].shape[0], idx.shape[1], block)
    experts = MoE(x.shape[1], p["w1"].shape[1], RouterSpec(p["w1"].shape[0], idx.shape[1])).experts
    ws = [ms.Parameter(ms.Tensor(p[n]), name=n) for n in ("w1", "w2", "w3")]

    def grouped(x, w, w1, w2, w3):
        rows, block_expert, dest, load, counts = dispatcher.dispatch(x, ms.Tensor(idx))
        from mf_models.common.moe import experts_forward
        return dispatcher.combine(experts_forward(experts, w1, w2, w3, rows, block_expert), dest, w), load, counts

    def dense(x, w, w1, w2, w3):
        return experts_dense_reference(w1, w2, w3, x, ms.Tensor(idx), w)

    args = (ms.Tensor(x), ms.Tensor(w), *ws)
    out, load, counts = grouped(*args)
    ref = dense(*args)
    probe = np.random.default_rng(1).normal(size=out.shape).astype(np.float32)

    def loss_grouped(*a):
        return (grouped(*a)[0] * ms.Tensor(probe)).sum()

    def loss_dense(*a):
        return (dense(*a) * ms.Tensor(probe)).sum()

    g = ms.grad(loss_grouped, grad_position=(0, 1, 2, 3, 4))(*args)
    g_ref = ms.grad(loss_dense, grad_position=(0, 1, 2, 3, 4))(*args)
    return out.asnumpy(), ref.asnumpy(), [a.asnumpy() for a in g], [a.asnumpy() for a in g_ref], load.asnumpy(), \
        counts.asnumpy()


@pytest.mark.parametrize("routing, block", [("random", None), ("random", 1), ("random", 5),
                                            ("one_expert_hot", None), ("unused_experts", 3)])
def test_dropless_dispatch_equals_the_dense_reference(routing, block):
    t, h, i, e, k = 23, 8, 6, 5, 2
    rng = np.random.default_rng(7)
    p = params(rng, h, i, e, False, False)
    if routing == "random":
        idx = np.stack([rng.choice(e, k, replace=False) for _ in range(t)])
    elif routing == "one_expert_hot":  # every token picks expert 3 (and one other): the worst load
        idx = np.stack([[3, rng.choice([0, 1, 2, 4])] for _ in range(t)])
    else:  # experts 0 and 4 never chosen
        idx = np.stack([rng.choice([1, 2, 3], k, replace=False) for _ in range(t)])
    idx = idx.astype(np.int32)
    w = rng.uniform(0.1, 1, (t, k)).astype(np.float32)
    x = rng.normal(size=(t, h)).astype(np.float32)
    out, ref, grads, grads_ref, load, counts = _dispatch_and_dense(x, idx, w, p, block)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, ref_experts(x.astype(np.float64), {n: v.astype(np.float64) for n, v in p.items()},
                                                idx, w.astype(np.float64)), atol=2e-5)
    for name, got, want in zip(("x", "weights", "w1", "w2", "w3"), grads, grads_ref):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
    np.testing.assert_array_equal(load, np.bincount(idx.ravel(), minlength=e))
    b = block or -(-t * k // (4 * e))
    assert counts[0] == 0 and counts[1] == max_blocks(t * k, e, b) * b - t * k


def test_dispatch_layout_is_expert_ordered_blocks():
    idx = np.array([[2, 0], [2, 1], [0, 2], [2, 1]], np.int32)   # loads: e0 2, e1 2, e2 4
    dispatcher = LocalDispatcher(3, 2, block=3)
    x = np.arange(4, dtype=np.float32).reshape(4, 1) + 1          # token t has value t + 1
    rows, block_expert, dest, load, _ = dispatcher.dispatch(ms.Tensor(x), ms.Tensor(idx))
    # blocks of 3 rows: e0 [t0, t2, pad], e1 [t1, t3, pad], e2 [t0, t1, t2], e2 [t3, pad, pad]
    assert block_expert.asnumpy().tolist()[:4] == [0, 1, 2, 2]
    assert rows.asnumpy().ravel().tolist()[:12] == [1, 3, 0, 2, 4, 0, 1, 2, 3, 4, 0, 0]
    assert load.asnumpy().tolist() == [2, 2, 4]
    assert sorted(dest.asnumpy().tolist()) == [0, 1, 3, 4, 6, 7, 8, 9]
