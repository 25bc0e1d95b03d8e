"""The compiled step: clipping and AdamW against numpy, accumulation equality, non-finite skip."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from mf_trainer.loss import MaskedLMLoss, token_cross_entropy
from mf_trainer.optimizer import AdamW
from mf_trainer.step import StepRunner

pytestmark = pytest.mark.usefixtures("graph_mode")


def _batch(seed, rows=4, seq=8, vocab=50, mask_p=0.3):
    rng = np.random.RandomState(seed)
    return {"input_ids": rng.randint(0, vocab, (rows, seq)), "labels": rng.randint(0, vocab, (rows, seq)),
            "loss_mask": (rng.rand(rows, seq) > mask_p).astype(np.float32)}


def _split(batch, parts):
    n = len(batch["input_ids"]) // parts
    return [{k: v[i * n:(i + 1) * n] for k, v in batch.items()} for i in range(parts)]


def test_token_cross_entropy_matches_numpy():
    rng = np.random.RandomState(0)
    logits = (rng.randn(6, 11) * 4).astype(np.float32)
    labels = rng.randint(0, 11, 6).astype(np.int32)
    z = logits.astype(np.float64)
    ref = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1) - z[np.arange(6), labels]
    got = token_cross_entropy(ms.Tensor(logits), ms.Tensor(labels)).asnumpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5)


def test_one_step_equals_numpy_clip_then_torch_adamw(toy_lm, torch_adamw_reference):
    batch = _batch(1)
    model = toy_lm(0)
    names = [p.name for p in model.trainable_params()]
    init = [p.asnumpy().copy() for p in model.trainable_params()]
    # Reference gradients of sum(loss * mask) / sum(mask), taken outside the step.
    loss_cell = MaskedLMLoss(model)
    inv = ms.Tensor(np.float32(1.0 / batch["loss_mask"].sum()))
    args = [ms.Tensor(batch["labels"].astype(np.int32)), ms.Tensor(batch["loss_mask"]), inv,
            ms.Tensor(batch["input_ids"].astype(np.int32))]
    ref_loss, grads = ms.value_and_grad(loss_cell, None, model.trainable_params())(*args)
    grads = [g.asnumpy() for g in grads]
    norm = float(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)))
    max_norm = norm / 4  # force clipping
    clipped = [g * np.float32(max_norm / (norm + 1e-6)) for g in grads]
    decay = [n != "proj.bias" for n in names]
    ref_params, _, _ = torch_adamw_reference(init, [clipped], [1e-2], (0.9, 0.95), 1e-8, 0.1, decay)

    opt = AdamW(model.trainable_params(), weight_decay=0.1, decay=decay)
    done = StepRunner(MaskedLMLoss(model), opt, max_norm, 1)([batch], 1e-2)
    loss, got_norm, applied = done.loss, done.grad_norm, done.applied
    assert done.tokens == float(batch["loss_mask"].sum()) and done.local_norm == got_norm
    assert applied and opt.step == 1
    assert loss == pytest.approx(float(ref_loss.asnumpy()), rel=1e-6)
    assert got_norm == pytest.approx(norm, rel=1e-5)
    for p, ref in zip(model.trainable_params(), ref_params):
        np.testing.assert_allclose(p.asnumpy(), ref, rtol=1e-5, atol=1e-6)


def _train(toy_lm, accumulation, steps=3):
    model = toy_lm(0)
    opt = AdamW(model.trainable_params(), weight_decay=0.1)
    runner = StepRunner(MaskedLMLoss(model), opt, 1.0, accumulation)
    losses = [runner(_split(_batch(10 + s), accumulation), 1e-2).loss for s in range(steps)]
    return np.array(losses), [p.asnumpy() for p in model.trainable_params()]


def test_accumulation_gives_the_global_batch_loss_and_update(toy_lm):
    ref_losses, ref_params = _train(toy_lm, 1)
    for parts in (2, 4):
        losses, params = _train(toy_lm, parts)
        # Same definition of the loss (one sum over the global batch); only float32 summation
        # order differs, so the agreement is at rounding level.
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
        for a, b in zip(params, ref_params):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_non_finite_step_changes_nothing(toy_lm, accumulation):
    model = toy_lm(0)
    opt = AdamW(model.trainable_params(), weight_decay=0.1)
    runner = StepRunner(MaskedLMLoss(model), opt, 1.0, accumulation)
    runner(_split(_batch(1), accumulation), 1e-2)
    before = [p.asnumpy().copy() for p in model.trainable_params()]
    moments = opt.state_dict()
    masked_out = _batch(2)
    masked_out["loss_mask"][:] = 0.0  # no token counts: 0 * inf = NaN loss
    done = runner(_split(masked_out, accumulation), 1e-2)
    assert not done.applied and np.isnan(done.loss) and opt.step == 1
    for a, p in zip(before, model.trainable_params()):
        assert np.array_equal(a, p.asnumpy())
    after = opt.state_dict()
    assert all(np.array_equal(moments[k], after[k]) for k in opt.moment_names())
    # and the next good step proceeds (the accumulation buffers were cleared)
    done = runner(_split(_batch(3), accumulation), 1e-2)
    assert done.applied and np.isfinite(done.grad_norm) and opt.step == 2


@pytest.mark.parametrize("accumulation", [1, 2])
def test_per_parameter_norms_are_the_numpy_norms_of_the_gradients(toy_lm, accumulation):
    """monitor.train_state.local_norm's vector: each selected parameter's gradient norm before
    clipping (float64 numpy of the reference gradients), -1 (another stage's) as 0."""
    batch = _batch(3)
    model = toy_lm(0)
    params = model.trainable_params()
    inv = ms.Tensor(np.float32(1.0 / batch["loss_mask"].sum()))
    args = [ms.Tensor(batch["labels"].astype(np.int32)), ms.Tensor(batch["loss_mask"]), inv,
            ms.Tensor(batch["input_ids"].astype(np.int32))]
    _, grads = ms.value_and_grad(MaskedLMLoss(model), None, params)(*args)
    want = [float(np.linalg.norm(g.asnumpy().astype(np.float64))) for g in grads]
    positions = (len(params) - 1, -1, 0)
    runner = StepRunner(MaskedLMLoss(model), AdamW(params, weight_decay=0.1), 1e-3, accumulation,
                        positions=positions)
    done = runner(_split(batch, accumulation), 1e-2)
    assert done.applied and len(done.param_norms) == 3
    np.testing.assert_allclose(done.param_norms, [want[-1], 0.0, want[0]], rtol=2e-6)
    # Together they are the global norm (the one clipping uses), which here is far above max_norm.
    assert done.grad_norm == pytest.approx(float(np.sqrt(sum(w * w for w in want))), rel=2e-6)


@pytest.mark.parametrize("kind", ["untied", "tied", "lora_output", "moe"])
def test_fused_head_loss_steps_like_the_logits_path(kind):
    """The training loss fused with the output projection (mf-parallel's LinearCrossEntropy, here in
    8-token chunks) against the same loss on the whole logits (fuse_head=False), on an mf-models
    model: the same gradients; for the tied model also two accumulated compiled steps with the same
    losses and norms (sums differ in order only; the weights after AdamW are not compared: it
    normalises every element, so a gradient element near zero turns rounding into an update)."""
    import mf_models
    from mf_trainer.moe import MoELMLoss

    section = mf_models.tiny_model_section("mixtral" if kind == "moe" else "llama", tie_word_embeddings=kind == "tied")
    batch = _batch(1, vocab=64)
    args = [ms.Tensor(batch["labels"].astype(np.int32)), ms.Tensor(batch["loss_mask"]),
            ms.Tensor(np.float32(1.0 / batch["loss_mask"].sum())), ms.Tensor(batch["input_ids"].astype(np.int32))]
    grads, steps = [], []
    for fuse in (True, False):
        model = mf_models.build_model(section, seed=0)
        if kind == "lora_output":
            mf_models.apply_lora(model, r"output|.*wq", rank=4, alpha=8.0, seed=1)
        make = MoELMLoss if kind == "moe" else MaskedLMLoss
        loss_cell = make(model, fuse_head=fuse)
        assert loss_cell.fused == fuse
        if fuse:
            for cell in loss_cell.head_loss.cells():
                cell.chunk_bytes = 8 * 4 * 64
        params = model.trainable_params()
        out, g = ms.value_and_grad(loss_cell, None, params, has_aux=kind == "moe")(*args)
        grads.append([x.asnumpy() for x in g])
        if kind == "tied":
            runner = StepRunner(loss_cell, AdamW(params, weight_decay=0.1), 1.0, 2)
            steps.append([runner(_split(_batch(s, vocab=64), 2), 1e-2) for s in (1, 2)])
    for a, b in zip(*grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * float(np.abs(b).max()))
    for a, b in zip(*steps) if steps else ():
        assert a.loss == pytest.approx(b.loss, rel=2e-6) and a.grad_norm == pytest.approx(b.grad_norm, rel=2e-5)
