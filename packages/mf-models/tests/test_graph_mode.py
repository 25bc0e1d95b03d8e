"""GRAPH_MODE: the forward, `ms.value_and_grad` and an optimizer step compile and agree with
PyNative; a few steps lower the loss; generation compiles once per shape and matches PyNative."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops

import mf_models
from mf_models import build_model, model_state, tiny_model_section

rng = np.random.default_rng(0)
TOKENS = rng.integers(0, 64, (2, 13)).astype(np.int32)
INPUTS, LABELS = TOKENS[:, :-1], TOKENS[:, 1:]
# Megatron packing in the compiled step too: row 0 holds two documents (reset positions and a
# block-diagonal causal mask, True = masked), row 1 one.
POSITIONS = np.stack([np.r_[np.arange(5), np.arange(7)], np.arange(12)]).astype(np.int32)
_allowed = np.tril(np.ones((2, 12, 12), bool))
_allowed[0, 5:, :5] = False
MASK = ~_allowed[:, None]


class TrainStep(nn.Cell):
    """loss, grads = value_and_grad(next-token cross entropy); optimizer(grads)."""

    def __init__(self, model, optimizer):
        super().__init__(auto_prefix=False)  # parameter names stay the model's own
        self.model = model
        self.optimizer = optimizer
        self.ce = ops.SparseSoftmaxCrossEntropyWithLogits()
        self.grad_fn = ms.value_and_grad(self.loss, None, optimizer.parameters)

    def loss(self, input_ids, labels, position_ids, attention_mask):
        logits = self.model(input_ids, position_ids, attention_mask)
        return self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def construct(self, input_ids, labels, position_ids, attention_mask):
        loss, grads = self.grad_fn(input_ids, labels, position_ids, attention_mask)
        self.optimizer(grads)
        return loss, grads


def pynative_loss(model):
    logits = model(ms.Tensor(INPUTS), ms.Tensor(POSITIONS), ms.Tensor(MASK)).asnumpy().astype(np.float64).reshape(-1, 64)
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -logp[np.arange(logp.shape[0]), LABELS.reshape(-1)].mean()


# Compiles cost seconds each, so: Qwen3 (Llama's block plus q/k norms: it runs every Llama cell;
# Llama itself compiles in the generation test below) and DeepSeek-V3 with a single MoE layer (its
# dense feed-forward is the same cell), one layer each.
ONE_LAYER = {"qwen3": {}, "deepseek_v3": {"first_k_dense_replace": 0}}


@pytest.mark.parametrize("kind", sorted(ONE_LAYER))
def test_compiled_train_steps_match_pynative_and_learn(kind):
    model = build_model(tiny_model_section(kind, num_hidden_layers=1, **ONE_LAYER[kind]), seed=0)
    expected_first = pynative_loss(model)
    trainable = model.trainable_params()
    assert all("expert_bias" not in p.name for p in trainable)
    optimizer = nn.Adam(trainable, learning_rate=1e-2)
    step = TrainStep(model, optimizer)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        losses = []
        for i in range(8):
            loss, grads = step(ms.Tensor(INPUTS), ms.Tensor(LABELS), ms.Tensor(POSITIONS), ms.Tensor(MASK))
            losses.append(float(loss.asnumpy()))
            if i == 0:
                grads = [g.asnumpy() for g in grads]
                assert all(np.isfinite(g).all() for g in grads)
                by_name = dict(zip([p.name for p in trainable], grads))
                assert np.abs(by_name["tok_embeddings.weight"]).sum() > 0
                if kind == "deepseek_v3":  # gradients reach the router through the routing weights
                    assert np.abs(by_name["layers.0.moe.router.gate.weight"]).sum() > 0
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert losses[0] == pytest.approx(expected_first, abs=1e-5)
    assert losses[-1] < losses[0] - 0.5, losses
    assert pynative_loss(model) < losses[0]  # the optimizer updated the model's own parameters


def test_compiled_generation_matches_hf(hf_fixtures, graph_mode):
    """Prefill and decode graphs (one compile each) reproduce HF's greedy tokens; a second call
    reuses them with a reset cache. One checkpoint is enough here (all are checked in PyNative)."""
    names = sorted(p.name[: -len("_ref.npz")] for p in hf_fixtures.glob("*_ref.npz"))
    name = "llama" if "llama" in names else names[0]
    model = mf_models.load_hf(hf_fixtures / name)
    ref = np.load(hf_fixtures / f"{name}_ref.npz")
    names_before = set(model_state(model))
    new = ref["greedy"].shape[1] - ref["prompt"].shape[1]
    np.testing.assert_array_equal(mf_models.generate(model, ref["prompt"], new), ref["greedy"])
    np.testing.assert_array_equal(mf_models.generate(model, ref["prompt"], new), ref["greedy"])
    assert set(model_state(model)) == names_before
    assert all(not p.name.startswith("model.") for p in model.get_parameters())


class MoETrainStep(nn.Cell):
    """The training forward in a compiled step: loss = CE + balance loss; the routing statistics
    come out as aux outputs of value_and_grad (no gradient)."""

    def __init__(self, model, optimizer):
        super().__init__(auto_prefix=False)
        self.model = model
        self.optimizer = optimizer
        self.ce = ops.SparseSoftmaxCrossEntropyWithLogits()
        self.grad_fn = ms.value_and_grad(self.loss, None, optimizer.parameters, has_aux=True)

    def loss(self, input_ids, labels):
        logits, aux, load, counts = self.model.forward_train(input_ids)
        return self.ce(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)) + aux, aux, load, counts

    def construct(self, input_ids, labels):
        (loss, aux, load, counts), grads = self.grad_fn(input_ids, labels)
        self.optimizer(grads)
        return loss, aux, load, counts, grads


def test_compiled_training_forward_with_balance_loss_and_bias_update():
    section = tiny_model_section("deepseek_v3", num_hidden_layers=1, first_k_dense_replace=0, aux_loss_alpha=0.1)
    model = build_model(section, seed=0)
    ids, labels = ms.Tensor(INPUTS), ms.Tensor(LABELS)
    trainable = model.trainable_params()
    step = MoETrainStep(model, nn.SGD(trainable, learning_rate=0.0))   # lr 0: compare gradients, weights fixed
    want, want_grads = ms.value_and_grad(step.loss, None, trainable, has_aux=True)(ids, labels)
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        loss, aux, load, counts, grads = step(ids, labels)
        assert float(loss.asnumpy()) == pytest.approx(float(want[0].asnumpy()), abs=1e-5)
        assert float(aux.asnumpy()) == pytest.approx(float(want[1].asnumpy()), abs=1e-6) and float(aux.asnumpy()) > 0
        np.testing.assert_array_equal(load.asnumpy(), want[2].asnumpy())
        assert counts.asnumpy()[0, 0] == 0 and load.asnumpy().sum() == INPUTS.size * 2
        for name, g, w in zip([p.name for p in trainable], grads, want_grads):
            np.testing.assert_allclose(g.asnumpy(), w.asnumpy(), rtol=1e-4, atol=1e-6, err_msg=name)
        # the bias update between steps reaches the compiled graph (a Parameter, read by reference)
        bias = model.layers[0].moe.router.expert_bias
        bias.set_data(ms.Tensor(np.array([5.0, 5.0, 0.0, 0.0], np.float32)))
        moved = step(ids, labels)[2].asnumpy()
        assert moved[0].tolist() == [INPUTS.size, INPUTS.size, 0, 0]
        mf_models.update_expert_bias(model, moved)
        np.testing.assert_allclose(bias.asnumpy(), [5 - 1e-3, 5 - 1e-3, 1e-3, 1e-3])
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
