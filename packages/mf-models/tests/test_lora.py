"""LoRA adapters (mf_models.lora): names, freezing, the update's formula against numpy, merging
(mf_ckpt.merge_lora) against the adapted forward, errors, and adapter checkpoints merged on load."""

from __future__ import annotations

import numpy as np
import pytest
from mindspore import Tensor

import mf_ckpt
import mf_models
from mf_models.inference import load_pretrained

SECTION = mf_models.tiny_model_section("llama", tie_word_embeddings=False)
IDS = Tensor(np.random.default_rng(0).integers(0, 64, (2, 12)).astype(np.int32))


def _model(seed=1):
    return mf_models.build_model(SECTION, seed=seed)


def _randomise_b(model, seed=2):
    rng = np.random.default_rng(seed)
    for name, p in model.parameters_and_names():
        if name.endswith(".lora_b"):
            p.set_data(Tensor(rng.normal(0, 0.2, p.shape).astype(np.float32)))


def test_adapters_keep_base_names_freeze_the_base_and_start_as_the_base():
    model = _model()
    base = mf_models.model_state(model)
    reference = model(IDS).asnumpy()
    adapted = mf_models.apply_lora(model, r".*w[qv]|output", rank=4, alpha=8.0, exclude_layers=[1], seed=3)
    assert adapted == ["layers.0.attention.wq", "layers.0.attention.wv", "output"]
    state = mf_models.model_state(model)
    assert set(state) == set(base) | {f"{m}.lora_{x}" for m in adapted for x in "ab"}
    assert all(np.array_equal(state[n], v) for n, v in base.items())
    assert [p.name for p in model.trainable_params()] == [f"{m}.lora_{x}" for m in adapted for x in "ab"]
    assert all(p.name == n for n, p in model.parameters_and_names())  # full names, as optimizers key on them
    assert state["output.lora_a"].shape == (4, 32) and state["output.lora_b"].shape == (64, 4)
    bound = 1 / np.sqrt(32)
    assert 0 < np.abs(state["output.lora_a"]).max() <= bound and not state["output.lora_b"].any()
    assert np.array_equal(model(IDS).asnumpy(), reference)  # B = 0: exactly the base
    again = _model()
    mf_models.apply_lora(again, r".*w[qv]|output", rank=4, alpha=8.0, exclude_layers=[1], seed=3)
    assert all(np.array_equal(v, mf_models.model_state(again)[n]) for n, v in state.items())  # seeded


def test_adapted_linear_computes_the_lora_formula():
    model = _model()
    mf_models.apply_lora(model, "output", rank=3, alpha=6.0)
    _randomise_b(model)
    cell = model.output
    x = np.random.default_rng(4).normal(size=(2, 5, 32)).astype(np.float32)
    w, a, b = cell.weight.asnumpy(), cell.lora_a.asnumpy(), cell.lora_b.asnumpy()
    expected = x.astype(np.float64) @ w.T + (6.0 / 3) * (x.astype(np.float64) @ a.T) @ b.T
    np.testing.assert_allclose(cell(Tensor(x)).asnumpy(), expected, rtol=1e-5, atol=1e-5)


def test_dropout_acts_on_the_adapter_input_in_training_mode_only():
    model = _model()
    mf_models.apply_lora(model, "output", rank=3, alpha=6.0, dropout=0.5)
    _randomise_b(model)
    cell = model.output
    x = Tensor(np.random.default_rng(5).normal(size=(4, 32)).astype(np.float32))
    inference = cell(x).asnumpy()
    model.set_train(True)
    trained = cell(x).asnumpy()
    model.set_train(False)
    assert np.array_equal(cell(x).asnumpy(), inference) and not np.allclose(trained, inference)


def test_merged_weights_give_the_adapted_logits():
    model = _model()
    modules = mf_models.apply_lora(model, ".*", rank=4, alpha=16.0, seed=7)
    _randomise_b(model)
    adapted_logits = model(IDS).asnumpy()
    state = mf_models.model_state(model)
    adapter = mf_models.adapter_state(model)
    base = {n: v for n, v in state.items() if n not in adapter}
    meta = mf_ckpt.make_lora_adapter_meta(rank=4, alpha=16.0, target_modules=".*", modules=modules)
    merged = mf_ckpt.merge_lora(base, adapter, meta)
    plain = mf_models.build_model(SECTION, init=False)
    mf_models.load_state(plain, merged)
    np.testing.assert_allclose(plain(IDS).asnumpy(), adapted_logits, rtol=0, atol=1e-5)
    assert np.abs(plain(IDS).asnumpy() - _model()(IDS).asnumpy()).max() > 1e-2  # the adapters do change it


def test_a_pattern_matching_nothing_lists_the_modules_there_are():
    with pytest.raises(mf_models.ModelConfigError) as err:
        mf_models.apply_lora(_model(), r"attn\.q_proj")
    assert str(err.value) == (
        r"lora.target_modules: 'attn\\.q_proj' matches none of the model's Linear modules (full names, re.fullmatch): "
        "layers.{0-1}.attention.wq, layers.{0-1}.attention.wk, layers.{0-1}.attention.wv, layers.{0-1}.attention.wo, "
        "layers.{0-1}.feed_forward.w1, layers.{0-1}.feed_forward.w2, layers.{0-1}.feed_forward.w3, output")
    with pytest.raises(mf_models.ModelConfigError, match="excludes every module target_modules matches"):
        mf_models.apply_lora(_model(), ".*wq", exclude_layers=[0, 1])
    with pytest.raises(mf_models.ModelConfigError, match="layer 2 does not exist"):
        mf_models.apply_lora(_model(), ".*wq", exclude_layers=[2])
    with pytest.raises(mf_models.ModelConfigError, match="not a regular expression"):
        mf_models.apply_lora(_model(), "(")
    ds = mf_models.build_model(mf_models.tiny_model_section("deepseek_v3"), seed=0)
    names = mf_models.describe_lora_modules(mf_models.linear_modules(ds))
    assert "layers.{0}.feed_forward.w1" in names and not any("moe.experts" in n for n in names)


def test_an_adapter_checkpoint_loads_merged_into_its_base(tmp_path):
    base_model = _model()
    base_dir = tmp_path / "base"
    mf_ckpt.save(str(base_dir), 5, mf_models.model_state(base_model), None, common={"hf_config": SECTION})
    adapted = _model()
    modules = mf_models.apply_lora(adapted, r".*w[kv]", rank=2, alpha=4.0)
    _randomise_b(adapted)
    meta = mf_ckpt.make_lora_adapter_meta(rank=2, alpha=4.0, target_modules=r".*w[kv]", modules=modules,
                                          base=base_dir, base_kind="mf", base_iteration=5)
    mf_ckpt.save(str(tmp_path / "adapter"), 9, mf_models.adapter_state(adapted), None,
                 common={"hf_config": SECTION, "adapter": meta})
    loaded = load_pretrained(tmp_path / "adapter")  # what mf generate / mf serve do
    assert loaded.iteration == 9 and any("LoRA adapter" in n for n in loaded.notes)
    np.testing.assert_allclose(loaded.model(IDS).asnumpy(), adapted(IDS).asnumpy(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["untied", "tied", "lora"])
def test_head_terms_sum_to_the_head(kind):
    """`head_terms` (what a loss fused with the output projection takes) add up to `head`'s logits:
    the output Linear, the tied table, a LoRA-adapted output (base + scaled adapter term)."""
    section = mf_models.tiny_model_section("llama", tie_word_embeddings=kind == "tied")
    model = mf_models.build_model(section, seed=1)
    if kind == "lora":
        mf_models.apply_lora(model, "output", rank=4, alpha=8.0, seed=3)
        _randomise_b(model)
    h = model.hidden_states(IDS)
    terms = model.head_terms(h)
    logits = sum(x.asnumpy().reshape(-1, x.shape[-1]) @ w.asnumpy().T for x, w in terms)
    np.testing.assert_allclose(logits, model.head(h).asnumpy().reshape(logits.shape), rtol=1e-5, atol=1e-6)
    assert model.head_terms_problem() is None
    assert model.head_trained() == {"untied": (True,), "tied": (True,), "lora": (False, True)}[kind]
