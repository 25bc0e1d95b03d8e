"""Model behaviour in PyNative: contract names, tying, init, packing masks, KV cache, FLOPs, MoE."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import mf_models
from mf_models import KVCache, ModelStateError, build_model, load_state, model_state, tiny_model_section

ALL = ("llama", "qwen2", "qwen3", "deepseek_v3", "mixtral", "qwen3_moe")
IDS = np.array([[3, 17, 9, 40, 2, 11, 5, 60, 23], [8, 1, 33, 14, 7, 50, 12, 4, 19]], np.int32)


def logits_of(model, ids=IDS, **kwargs):
    kwargs = {k: ms.Tensor(v) for k, v in kwargs.items()}
    return model(ms.Tensor(ids, ms.int32), **kwargs).asnumpy()


@pytest.fixture(scope="module")
def models():
    return {name: build_model(tiny_model_section(name), seed=1) for name in ALL}


def expected_names(kind: str, layers: int = 2, tied: bool = False, dense: int = 1, q_lora: bool = True) -> set[str]:
    names = {"tok_embeddings.weight", "norm.weight"} | (set() if tied else {"output.weight"})
    for i in range(layers):
        p = f"layers.{i}."
        names |= {p + "attention_norm.weight", p + "ffn_norm.weight"}
        if kind != "deepseek_v3":
            names |= {p + f"attention.{w}.weight" for w in ("wq", "wk", "wv", "wo")}
            if kind == "qwen2":
                names |= {p + f"attention.{w}.bias" for w in ("wq", "wk", "wv")}
            if kind in ("qwen3", "qwen3_moe"):
                names |= {p + "attention.q_norm.weight", p + "attention.k_norm.weight"}
            if kind == "mixtral" or (kind == "qwen3_moe" and i >= dense):
                names |= {p + "moe.router.gate.weight"} | {p + f"moe.experts.{w}" for w in ("w1", "w2", "w3")}
            else:
                names |= {p + f"feed_forward.{w}.weight" for w in ("w1", "w2", "w3")}
            continue
        attn = ["wkv_a", "kv_norm", "wkv_b", "wo"] + (["wq_a", "q_norm", "wq_b"] if q_lora else ["wq"])
        names |= {p + f"attention.{w}.weight" for w in attn}
        if i < dense:
            names |= {p + f"feed_forward.{w}.weight" for w in ("w1", "w2", "w3")}
        else:
            names |= {p + "moe.router.gate.weight", p + "moe.router.expert_bias"}
            names |= {p + f"moe.experts.{w}" for w in ("w1", "w2", "w3")}
            names |= {p + f"moe.shared_experts.{w}.weight" for w in ("w1", "w2", "w3")}
    return names


@pytest.mark.parametrize("kind", ALL)
def test_parameter_names_follow_the_contract(models, kind):
    state = model_state(models[kind])
    assert set(state) == expected_names(kind)
    if kind in ("deepseek_v3", "mixtral", "qwen3_moe"):
        assert state["layers.1.moe.experts.w1"].shape == (4, 16, 32)  # [E, I_moe, H]
        assert state["layers.1.moe.experts.w2"].shape == (4, 32, 16)
    if kind == "deepseek_v3":
        assert state["layers.1.attention.wkv_b.weight"].shape == (4 * (8 + 8), 16)
    else:
        assert state["layers.0.attention.wk.weight"].shape == (2 * models[kind].args.head_dim, 32)  # [nKV*hd, H]


def test_variants_build_with_their_names():
    biased = build_model(tiny_model_section("llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True))
    state = model_state(biased)
    assert set(state) == expected_names("llama", tied=True) | {
        f"layers.{i}.{m}.{w}.bias" for i in range(2) for m, ws in (("attention", "wq wk wv wo"), ("feed_forward", "w1 w2 w3"))
        for w in ws.split()}
    assert all(not state[n].any() for n in state if n.endswith(".bias"))  # zero biases
    no_lora = build_model(tiny_model_section("deepseek_v3", q_lora_rank=None, first_k_dense_replace=0, n_shared_experts=0))
    names = set(model_state(no_lora))
    assert names == {n for n in expected_names("deepseek_v3", dense=0, q_lora=False) if "shared_experts" not in n}
    assert logits_of(no_lora).shape == (2, 9, 64)


def test_tied_output_uses_the_embedding(models):
    tied = build_model(tiny_model_section("llama", tie_word_embeddings=True), seed=3)
    state = model_state(tied)
    untied = build_model(tiny_model_section("llama"), seed=4)
    load_state(untied, {**state, "output.weight": state["tok_embeddings.weight"]})
    np.testing.assert_allclose(logits_of(tied), logits_of(untied), atol=1e-6)


def test_initialisation_is_seeded_hf_style_and_per_tensor():
    a = model_state(build_model(tiny_model_section("deepseek_v3"), seed=7))
    b = model_state(build_model(tiny_model_section("deepseek_v3"), seed=7))
    c = model_state(build_model(tiny_model_section("deepseek_v3"), seed=8))
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["layers.0.attention.wo.weight"], c["layers.0.attention.wo.weight"])
    assert all((a[n] == 1).all() for n in a if n.endswith("norm.weight"))
    assert not a["layers.1.moe.router.expert_bias"].any()
    big = build_model(tiny_model_section("llama", vocab_size=4000, initializer_range=0.02), seed=0)
    emb = model_state(big)["tok_embeddings.weight"]
    assert abs(emb.std() - 0.02) < 5e-4 and abs(emb.mean()) < 5e-4
    # a tensor's initial value does not depend on which other tensors exist
    deeper = model_state(build_model(tiny_model_section("deepseek_v3", num_hidden_layers=3), seed=7))
    assert np.array_equal(deeper["layers.1.moe.experts.w2"], a["layers.1.moe.experts.w2"])
    padded = model_state(build_model(tiny_model_section("llama", pad_token_id=5)))
    assert not padded["tok_embeddings.weight"][5].any()


@pytest.mark.parametrize("kind", ["llama", "deepseek_v3", "mixtral"])
def test_packed_documents_match_separate_runs(models, kind):
    """Megatron reset_position_ids + reset_attention_mask: two documents in one row."""
    model = models[kind]
    row = IDS[:1]
    cut = 5
    positions = np.concatenate([np.arange(cut), np.arange(row.shape[1] - cut)])[None].astype(np.int32)
    seq = row.shape[1]
    allowed = np.tril(np.ones((seq, seq), bool))
    allowed[cut:, :cut] = False
    mask = ~allowed[None, None]  # True = masked out
    packed = logits_of(model, row, position_ids=positions, attention_mask=mask)
    np.testing.assert_allclose(packed[:, :cut], logits_of(model, row[:, :cut]), atol=1e-5)
    np.testing.assert_allclose(packed[:, cut:], logits_of(model, row[:, cut:]), atol=1e-5)
    # an int mask (1 = masked) means the same
    np.testing.assert_allclose(logits_of(model, row, position_ids=positions, attention_mask=mask.astype(np.int32)),
                               packed, atol=1e-6)


@pytest.mark.parametrize("kind", ALL)
def test_kv_cache_steps_equal_the_full_forward(models, kind):
    model = models[kind]
    full = logits_of(model)
    (k_heads, k_dim), (v_heads, v_dim) = model.kv_cache_shapes()
    cache = KVCache(len(model.layers), 2, IDS.shape[1] + 3, (k_heads, k_dim), (v_heads, v_dim))
    got = [model(ms.Tensor(IDS[:, :4]), None, None, cache).asnumpy()]
    for t in range(4, IDS.shape[1]):
        got.append(model(ms.Tensor(IDS[:, t:t + 1]), None, None, cache).asnumpy())
    np.testing.assert_allclose(np.concatenate(got, 1), full, atol=1e-5)


def test_left_padded_batch_generates_like_single_prompts(models):
    model = models["qwen3"]
    prompts = [[5, 9, 13, 2], [7, 30]]
    batch = np.array([prompts[0], [0, 0] + prompts[1]])
    padding = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])
    for use_cache in (True, False):
        out = mf_models.generate(model, batch, 5, padding_mask=padding, use_cache=use_cache)
        for row, prompt in enumerate(prompts):
            single = mf_models.generate(model, np.array(prompt), 5, use_cache=use_cache)
            np.testing.assert_array_equal(out[row, -5:], single[-5:])
            assert single.ndim == 1 and len(single) == len(prompt) + 5


def test_sampling_and_stopping(models):
    model = models["llama"]
    prompt = IDS[:, :3]
    greedy = mf_models.generate(model, prompt, 6)
    np.testing.assert_array_equal(mf_models.generate(model, prompt, 6, do_sample=True, top_k=1, seed=0), greedy)
    np.testing.assert_array_equal(mf_models.generate(model, prompt, 6, do_sample=True, top_p=1e-6, seed=5), greedy)
    a = mf_models.generate(model, prompt, 6, do_sample=True, temperature=2.0, top_k=20, top_p=0.9, seed=3)
    b = mf_models.generate(model, prompt, 6, do_sample=True, temperature=2.0, top_k=20, top_p=0.9, seed=3)
    np.testing.assert_array_equal(a, b)
    eos = int(greedy[0, 3])  # row 0 stops at once; row 1 goes on unless it meets the same id
    out = mf_models.generate(model, prompt, 6, eos_token_id=eos, pad_token_id=63)
    assert out[0, 3] == eos and (out[0, 4:] == 63).all()
    row1 = list(greedy[1, 3:])
    stop = row1.index(eos) + 1 if eos in row1 else 6
    np.testing.assert_array_equal(out[1, 3:3 + stop], greedy[1, 3:3 + stop])
    assert out.shape[1] == 3 + max(1, stop)
    with pytest.raises(ValueError, match="padding_mask must be left padding"):
        mf_models.generate(model, prompt, 2, padding_mask=np.array([[1, 1, 0], [1, 1, 1]]))
    with pytest.raises(ValueError, match="prompt ids must lie in"):
        mf_models.generate(model, np.array([[64]]), 2)


def test_state_round_trip_and_strict_errors(models):
    model = models["deepseek_v3"]
    state = model_state(model)
    clone = build_model(tiny_model_section("deepseek_v3"), seed=99)
    load_state(clone, state)
    np.testing.assert_array_equal(logits_of(clone), logits_of(model))
    bad = dict(state)
    bad.pop("norm.weight")
    bad["layers.0.attention.wq.weight"] = np.zeros((2, 2), np.float32)
    bad["layers.0.attention.wkv_b.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ModelStateError, match=r"missing 1: norm\.weight; unexpected 1: layers\.0\.attention\.wq\.weight; "
                                              r"shape mismatch 1: layers\.0\.attention\.wkv_b\.weight \(3, 3\) != \(64, 16\)"):
        load_state(clone, bad)
    np.testing.assert_array_equal(model_state(clone)["norm.weight"], state["norm.weight"])  # nothing half-loaded


def test_flops_per_token_palm_formula(models):
    llama = models["llama"]
    h, i, v, hd, layers, heads, kv = 32, 48, 64, 8, 2, 4, 2
    n = layers * (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * i) + v * h
    assert llama.num_flops_per_token(16) == 6 * n + 6 * layers * heads * (hd + hd) * 16
    ds = models["deepseek_v3"]
    attn = 32 * 24 + 24 * 4 * 12 + 32 * (16 + 4) + 16 * 4 * 16 + 4 * 8 * 32
    dense_ffn, expert, shared, router = 3 * 32 * 48, 3 * 32 * 16, 3 * 32 * 16, 32 * 4
    n = 2 * attn + dense_ffn + (2 * expert + shared + router) + 64 * 32  # top-2 of 4 experts
    assert ds.num_flops_per_token(10) == 6 * n + 6 * 2 * 4 * (12 + 8) * 10
    assert build_model(tiny_model_section("llama", seq_length=16)).num_flops_per_token() == llama.num_flops_per_token(16)


def test_qwen3_qk_norm_is_used(models):
    model = models["qwen3"]
    before = logits_of(model)
    param = model.layers[0].attention.k_norm.weight
    original = param.asnumpy()
    param.set_data(ms.Tensor(original * 2))
    try:
        assert np.abs(logits_of(model) - before).max() > 1e-4
    finally:
        param.set_data(ms.Tensor(original))


def test_rope_interleave_is_a_permutation_of_the_rope_rows(models):
    """DeepSeek's rope_interleave reads rope dims as (x0,x1),(x2,x3)..; with the rope rows of wq_b
    and wkv_a de-interleaved, the rotate-half model computes the same logits."""
    state = model_state(models["deepseek_v3"])
    plain = build_model(tiny_model_section("deepseek_v3", rope_interleave=False))
    nope, rope, heads, kv_rank = 8, 4, 4, 16
    order = np.r_[np.arange(0, rope, 2), np.arange(1, rope, 2)]
    permuted = dict(state)
    for i in range(2):
        wq_b = state[f"layers.{i}.attention.wq_b.weight"].reshape(heads, nope + rope, -1).copy()
        wq_b[:, nope:] = wq_b[:, nope:][:, order]
        permuted[f"layers.{i}.attention.wq_b.weight"] = wq_b.reshape(heads * (nope + rope), -1)
        wkv_a = state[f"layers.{i}.attention.wkv_a.weight"].copy()
        wkv_a[kv_rank:] = wkv_a[kv_rank:][order]
        permuted[f"layers.{i}.attention.wkv_a.weight"] = wkv_a
    load_state(plain, permuted)
    np.testing.assert_allclose(logits_of(plain), logits_of(models["deepseek_v3"]), atol=1e-5)
    load_state(plain, state)  # without the permutation the models differ
    assert np.abs(logits_of(plain) - logits_of(models["deepseek_v3"])).max() > 1e-4
