"""DeepSeek MoE against a numpy transcription of HF's DeepseekV3MoE (per-expert loop)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from mf_models.common.moe import MoE


def silu(x):
    return x / (1 + np.exp(-x))


def ref_moe(x, p, top_k, n_group, topk_group, norm, scale):
    t, e = x.shape[0], p["gate"].shape[0]
    scores = 1 / (1 + np.exp(-(x @ p["gate"].T)))
    choice = scores + p["bias"]
    groups = choice.reshape(t, n_group, e // n_group)
    group_scores = np.sort(groups, -1)[..., -2:].sum(-1)
    chosen_groups = np.argsort(-group_scores, -1)[:, :topk_group]
    group_mask = np.zeros((t, n_group))
    np.put_along_axis(group_mask, chosen_groups, 1.0, -1)
    choice = np.where(np.repeat(group_mask, e // n_group, -1) > 0, choice, 0.0)
    idx = np.argsort(-choice, -1)[:, :top_k]
    weights = np.take_along_axis(scores, idx, -1)
    if norm:
        weights = weights / (weights.sum(-1, keepdims=True) + 1e-20)
    weights = weights * scale
    out = np.zeros_like(x)
    for tok in range(t):
        for j in range(top_k):
            k = idx[tok, j]
            h = silu(x[tok] @ p["w1"][k].T) * (x[tok] @ p["w3"][k].T)
            out[tok] += weights[tok, j] * (h @ p["w2"][k].T)
    shared = silu(x @ p["s1"].T) * (x @ p["s3"].T) @ p["s2"].T
    return out + shared, idx


@pytest.mark.parametrize("n_group, topk_group, norm", [(2, 1, True), (1, 1, False), (4, 2, True)])
def test_moe_matches_hf_routing_and_experts(n_group, topk_group, norm):
    h, i, e, top_k, scale = 16, 8, 8, 2, 2.5
    rng = np.random.default_rng(n_group)
    p = {"gate": rng.normal(0, 0.5, (e, h)), "bias": rng.uniform(0, 0.3, e),
         "w1": rng.normal(0, 0.3, (e, i, h)), "w2": rng.normal(0, 0.3, (e, h, i)), "w3": rng.normal(0, 0.3, (e, i, h)),
         "s1": rng.normal(0, 0.3, (i, h)), "s2": rng.normal(0, 0.3, (h, i)), "s3": rng.normal(0, 0.3, (i, h))}
    p = {k: v.astype(np.float32) for k, v in p.items()}
    moe = MoE(h, i, e, top_k, 1, n_group, topk_group, norm, scale)
    moe.router.gate.weight.set_data(ms.Tensor(p["gate"]))
    moe.router.expert_bias.set_data(ms.Tensor(p["bias"]))
    for name in ("w1", "w2", "w3"):
        getattr(moe.experts, name).set_data(ms.Tensor(p[name]))
        getattr(moe.shared_experts, name).weight.set_data(ms.Tensor(p["s" + name[1]]))
    x = rng.normal(0, 1, (2, 5, h)).astype(np.float32)
    expected, idx = ref_moe(x.reshape(10, h).astype(np.float64), p, top_k, n_group, topk_group, norm, scale)
    got = moe(ms.Tensor(x)).asnumpy().reshape(10, h)
    np.testing.assert_allclose(got, expected, atol=2e-5)
    # the bias moved some selections away from the raw-score top-k (so it is really used)
    raw_idx = np.argsort(-(x.reshape(10, h) @ p["gate"].T), -1)[:, :top_k]
    if n_group == 1:
        assert any(set(a) != set(b) for a, b in zip(idx, raw_idx))
