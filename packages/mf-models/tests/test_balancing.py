"""Balance losses against float64 numpy transcriptions of the published formulas (DeepSeek-V3
paper eq. 17-20 / DeepSeek's MoEGate; transformers' load_balancing_loss_func), the training
forward's statistics, and DeepSeek's aux-loss-free bias update rule."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import mf_models
from mf_models import RoutingStats, build_model, tiny_model_section, update_expert_bias
from mf_models.common.balancing import BalanceSpec, balance_loss, bias_update
from mf_models.common.moe import MoE
from mf_models.common.router import RouterSpec

E, K, H, B, S = 6, 2, 8, 3, 7


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def topk(x, k):
    return np.argsort(-x, -1, kind="stable")[..., :k]


def deepseek_sequence_loss(logits, alpha, k):
    """Paper eq. 17-20 for one layer, logits [B, S, E]: per sequence f_i = E/(k S) sum_t 1(s_i,t in
    TopK(s_t)), P_i = 1/S sum_t s_i,t / sum_j s_j,t; alpha * sum_i f_i P_i, averaged over the batch."""
    _, seq_len, experts = logits.shape
    losses = []
    for seq in logits:
        s = sigmoid(seq)
        chosen = np.zeros_like(s)
        np.put_along_axis(chosen, topk(s, k), 1.0, -1)
        f = experts / (k * seq_len) * chosen.sum(0)
        p = (s / s.sum(-1, keepdims=True)).mean(0)
        losses.append(alpha * (f * p).sum())
    return np.mean(losses)


def deepseek_batch_loss(logits, alpha, k):
    """DeepSeek's MoEGate with seq_aux false: ce = one_hot(topk).mean over all T*k picks,
    fi = ce * E, Pi = scores.mean(0), alpha * sum(Pi * fi) (scores normalised sigmoid, as above)."""
    experts = logits.shape[-1]
    s = sigmoid(logits.reshape(-1, experts))
    picks = np.eye(experts)[topk(s, k).ravel()]
    fi = picks.mean(0) * experts
    pi = (s / s.sum(-1, keepdims=True)).mean(0)
    return alpha * (pi * fi).sum()


def transformers_switch_loss(layer_logits, coef, k):
    """transformers' load_balancing_loss_func(router_logits, E, k) * router_aux_loss_coef: the
    layers' logits concatenated, softmax, top-k one-hot mean [k, E] times the mean probability."""
    experts = layer_logits[0].shape[-1]
    cat = np.concatenate([lg.reshape(-1, experts) for lg in layer_logits], 0)
    probs = softmax(cat)
    mask = np.eye(experts)[topk(probs, k)]                 # [L*T, k, E]
    return coef * experts * (mask.mean(0) * probs.mean(0)[None]).sum()


def _moe(spec, seed):
    rng = np.random.default_rng(seed)
    moe = MoE(H, 4, spec, 0, True)
    gate = rng.normal(0, 1.0, (E, H)).astype(np.float32)
    moe.router.gate.weight.set_data(ms.Tensor(gate))
    for name, shape in (("w1", (E, 4, H)), ("w2", (E, H, 4)), ("w3", (E, 4, H))):
        getattr(moe.experts, name).set_data(ms.Tensor(rng.normal(0, 0.3, shape).astype(np.float32)))
    return moe, gate


@pytest.mark.parametrize("kind", ["sequence", "batch", "switch"])
def test_balance_losses_match_the_published_formulas(kind):
    spec = RouterSpec(E, K, "softmax" if kind == "switch" else "sigmoid", expert_bias=kind != "switch",
                      norm_topk_prob=True)
    coef = 0.37
    rng = np.random.default_rng(3)
    counts, sums, logits = [], [], []
    for layer in range(2):
        moe, gate = _moe(spec, layer)
        if spec.expert_bias:   # the bias moves the selection, not the balance loss's plain top-k
            moe.router.expert_bias.set_data(ms.Tensor(rng.uniform(0, 2, E).astype(np.float32)))
        x = rng.normal(size=(B, S, H)).astype(np.float32)
        _, _, _, c, p = moe(ms.Tensor(x))
        counts.append(c)
        sums.append(p)
        logits.append(x.astype(np.float64) @ gate.T.astype(np.float64))
    got = float(balance_loss(BalanceSpec(kind, coef), E, K, S, ms.ops.stack(counts), ms.ops.stack(sums)).asnumpy())
    if kind == "sequence":
        want = sum(deepseek_sequence_loss(lg, coef, K) for lg in logits)
    elif kind == "batch":
        want = sum(deepseek_batch_loss(lg, coef, K) for lg in logits)
    else:
        want = transformers_switch_loss(logits, coef, K)
    assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("kind", ["sequence", "batch", "switch"])
def test_shares_of_split_sequences_add_up_to_the_loss(kind):
    """Ranks holding pieces of every sequence (sequence / context parallelism): each computes the
    loss from the whole sequences' counts and its own tokens' score sums; the shares add up to the
    loss of the whole sequences (zigzag pieces of uneven length, as context parallelism cuts them)."""
    spec = RouterSpec(E, K, "softmax" if kind == "switch" else "sigmoid", expert_bias=kind != "switch")
    rng = np.random.default_rng(7)
    moe, _ = _moe(spec, 1)
    x = rng.normal(size=(B, S, H)).astype(np.float32)
    _, _, _, whole_counts, whole_sums = moe(ms.Tensor(x))
    pieces = [np.r_[0:2, S - 2:S], np.r_[2:S // 2], np.r_[S // 2:S - 2]]
    parts = [moe(ms.Tensor(np.ascontiguousarray(x[:, idx])))[3:] for idx in pieces]
    counts = sum(c.asnumpy() for c, _ in parts)
    np.testing.assert_array_equal(counts, whole_counts.asnumpy())
    loss_spec = BalanceSpec(kind, 0.37)
    want = float(balance_loss(loss_spec, E, K, S, whole_counts[None], whole_sums[None]).asnumpy())
    shares = [float(balance_loss(loss_spec, E, K, S, ms.Tensor(counts[None]), p[None]).asnumpy()) for _, p in parts]
    assert sum(shares) == pytest.approx(want, rel=1e-6)
    assert all(abs(share) < abs(want) for share in shares)      # a share alone is not the loss


def _router_inputs(model):
    """Hidden states entering each MoE router (PyNative forward pre-hooks)."""
    seen = []
    handles = [model.layers[i].moe.router.register_forward_pre_hook(lambda cell, args: seen.append(args[0].asnumpy()))
               for i in model.moe_layer_ids()]
    return seen, handles


@pytest.mark.parametrize("kind, extra", [
    ("deepseek_v3", dict(aux_loss_alpha=0.01, first_k_dense_replace=0)),
    ("deepseek_v3", dict(aux_loss_alpha=0.01, seq_aux=False)),
    ("mixtral", dict(output_router_logits=True, router_aux_loss_coef=0.02)),
    ("qwen3_moe", dict(output_router_logits=True, mlp_only_layers=[], decoder_sparse_step=1)),
])
def test_forward_train_returns_logits_loss_and_statistics(kind, extra):
    model = build_model(tiny_model_section(kind, **extra), seed=5)
    ids = np.random.default_rng(0).integers(0, 64, (2, 9)).astype(np.int32)
    seen, handles = _router_inputs(model)
    logits, aux, load, counts = model.forward_train(ms.Tensor(ids))
    for h in handles:
        h.remove()
    np.testing.assert_array_equal(logits.asnumpy(), model(ms.Tensor(ids)).asnumpy())
    layers = model.moe_layer_ids()
    assert load.shape == (len(layers), model.num_experts) and counts.shape == (len(layers), 2)
    # reference statistics from the routers' inputs, in numpy
    router_logits = [x.astype(np.float64) @ model.layers[i].moe.router.gate.weight.asnumpy().T.astype(np.float64)
                     for x, i in zip(seen, layers)]
    args = model.args
    for row, i in enumerate(layers):
        idx = model.layers[i].moe.router(ms.Tensor(seen[row]))[0].asnumpy()
        np.testing.assert_array_equal(load.asnumpy()[row], np.bincount(idx.ravel(), minlength=model.num_experts))
        assert counts.asnumpy()[row, 0] == 0
    reshaped = [lg.reshape(2, 9, -1) for lg in router_logits]
    if kind == "deepseek_v3":
        fn = deepseek_sequence_loss if args.seq_aux else deepseek_batch_loss
        want = sum(fn(lg, args.aux_loss_alpha, model.top_k) for lg in reshaped)
    else:
        want = transformers_switch_loss(reshaped, args.router_aux_loss_coef, model.top_k)
    assert float(aux.asnumpy()) == pytest.approx(want, rel=1e-5)
    stats = RoutingStats.from_outputs(model, load, counts)
    metrics = stats.metrics()
    assert metrics["moe/dropped"] == 0 and stats.layers == tuple(layers)
    assert metrics[f"moe/layer{layers[0]}/imbalance"] == pytest.approx(
        load.asnumpy()[0].max() / load.asnumpy()[0].mean())


def test_dense_models_and_disabled_losses_have_no_aux_loss():
    ids = ms.Tensor(np.arange(12).reshape(2, 6).astype(np.int32))
    _, aux, load, counts = build_model(tiny_model_section("llama")).forward_train(ids)
    assert float(aux.asnumpy()) == 0 and load.shape == (0, 1) and counts.shape == (0, 2)
    _, aux, load, _ = build_model(tiny_model_section("mixtral")).forward_train(ids)   # output_router_logits false
    assert float(aux.asnumpy()) == 0 and load.asnumpy().sum() == 12 * 2 * 2


def test_balance_loss_gradient_reaches_the_router_only_through_the_scores():
    model = build_model(tiny_model_section("deepseek_v3", aux_loss_alpha=1.0, first_k_dense_replace=0), seed=2)
    ids = ms.Tensor(np.arange(18).reshape(2, 9).astype(np.int32))
    gate = model.layers[0].moe.router.gate.weight

    def aux_only(ids):
        return model.forward_train(ids)[1]

    grad = ms.grad(aux_only, None, [gate])(ids)[0].asnumpy()
    assert np.abs(grad).sum() > 0
    # the balance loss depends on the last layer's router input, not on that layer's experts
    expert_grad = ms.grad(aux_only, None, [model.layers[-1].moe.experts.w1])(ids)[0].asnumpy()
    assert not expert_grad.any()


# ----------------------------------------------------------------------------- bias update
def test_bias_update_rule_is_deepseeks():
    load = np.array([[10, 2, 6, 6], [0, 0, 0, 24]], np.float32)
    np.testing.assert_array_equal(bias_update(load, 1e-3),
                                  np.float32(1e-3) * np.array([[-1, 1, 0, 0], [1, 1, 1, -1]], np.float32))


def test_update_expert_bias_moves_the_bias_and_balances_the_load():
    model = build_model(tiny_model_section("deepseek_v3", first_k_dense_replace=0, n_group=1, topk_group=1,
                                           num_hidden_layers=1), seed=3)
    router = model.layers[0].moe.router
    router.expert_bias.set_data(ms.Tensor(np.array([1.0, 1.0, 0, 0], np.float32)))   # everyone picks experts 0, 1
    ids = ms.Tensor(np.random.default_rng(0).integers(0, 64, (4, 16)).astype(np.int32))
    before = model.forward_train(ids)[2].asnumpy()
    assert before[0].tolist() == [64, 64, 0, 0]
    bias0 = router.expert_bias.asnumpy().copy()
    delta = update_expert_bias(model, before)          # DeepSeek's default rate 1e-3
    np.testing.assert_array_equal(router.expert_bias.asnumpy(), bias0 + bias_update(before, 1e-3)[0])
    np.testing.assert_array_equal(delta, bias_update(before, 1e-3))
    first = RoutingStats.from_outputs(model, before, np.zeros((1, 2))).imbalance()[0]
    for _ in range(30):
        update_expert_bias(model, model.forward_train(ids)[2], rate=0.05)
    after = RoutingStats.from_outputs(model, model.forward_train(ids)[2], np.zeros((1, 2))).imbalance()[0]
    assert first == 2.0 and after < 1.4, after
    frozen = router.expert_bias.asnumpy().copy()
    update_expert_bias(model, model.forward_train(ids)[2], rate=0.0)
    np.testing.assert_array_equal(router.expert_bias.asnumpy(), frozen)


def test_update_expert_bias_errors():
    model = build_model(tiny_model_section("deepseek_v3"), seed=0)
    with pytest.raises(mf_models.ModelConfigError, match=r"tokens_per_expert has shape \[2, 4\], the model has 1 MoE"):
        update_expert_bias(model, np.zeros((2, 4)))
    with pytest.raises(mf_models.ModelConfigError, match="routers have no expert bias"):
        update_expert_bias(build_model(tiny_model_section("mixtral")), np.zeros((2, 4)))


def test_update_expert_bias_on_an_fsdp_sharded_model():
    import mf_parallel as mp
    from mf_models.common.parallel import apply_fsdp, moe_units

    model = build_model(tiny_model_section("deepseek_v3"), seed=0)
    mesh = mp.init_mesh(mp.ParallelDims(1))
    apply_fsdp(model, mesh, mp.Layout.for_dims(mesh.dims), moe_units)
    load = np.array([[5, 1, 1, 1]], np.float32)
    update_expert_bias(model, load, mesh=mesh)
    np.testing.assert_array_equal(mp.gather_full_state(model, mesh)["layers.1.moe.router.expert_bias"],
                                  bias_update(load, 1e-3)[0])


@pytest.mark.parametrize("kind, extra", [("llama", {}), ("qwen2", {}), ("mixtral", {}), ("deepseek_v3", {}),
                                         ("deepseek_v3", {"first_k_dense_replace": 2}),
                                         ("qwen3_moe", {"mlp_only_layers": [1], "num_hidden_layers": 3})])
def test_the_arguments_know_the_moe_layers_the_model_builds(kind, extra):
    # the trainer's preflight asks the arguments (no MindSpore); the model's statistics have these rows
    args = mf_models.build_args(tiny_model_section(kind, **extra))[1]
    assert args.moe_layer_ids() == build_model(tiny_model_section(kind, **extra)).moe_layer_ids()
    rate = args.expert_bias_rate()
    assert rate == (1e-3 if kind == "deepseek_v3" else 0.0)
