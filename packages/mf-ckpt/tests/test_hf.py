"""Hugging Face <-> mf conversion against checkpoints written by transformers 5.24 (shared fixtures)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import mf_ckpt
from mf_ckpt import CheckpointError, hf_to_mf, load_hf_state, mf_to_hf, save_hf

ARCHS = ["llama", "qwen2", "qwen3", "deepseek_v3", "mixtral", "qwen3_moe", "gpt2", "glm4", "qwen2_moe", "glm4_moe"]


def hf_tensors(hf_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of an HF dir, read with safetensors itself (an independent reader)."""
    index = hf_dir / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for f in files:
        out.update(load_file(str(hf_dir / f)))
    return out


def assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.parametrize("arch", ARCHS)
def test_fixture_round_trip_is_byte_identical(hf_fixtures, tmp_path, arch):
    src = hf_fixtures / arch
    config, state = load_hf_state(src)
    assert config == json.loads((src / "config.json").read_text())
    save_hf(tmp_path / "out", state, config)
    assert_identical(hf_tensors(src), hf_tensors(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == config
    with safe_open(str(tmp_path / "out" / "model.safetensors"), "np") as f:
        assert f.metadata() == {"format": "pt"}  # transformers refuses safetensors files without it


def contract_names(template: list[str], layers: int) -> set[str]:
    return {n.format(i=i) for n in template for i in range(layers)}


LLAMA_LAYER = [
    "layers.{i}.attention_norm.weight", "layers.{i}.attention.wq.weight", "layers.{i}.attention.wk.weight",
    "layers.{i}.attention.wv.weight", "layers.{i}.attention.wo.weight", "layers.{i}.ffn_norm.weight",
    "layers.{i}.feed_forward.w1.weight", "layers.{i}.feed_forward.w2.weight", "layers.{i}.feed_forward.w3.weight",
]


def test_llama_names_follow_the_contract(hf_fixtures):
    _, state = load_hf_state(hf_fixtures / "llama")  # tied embeddings: no output.weight
    assert set(state) == {"tok_embeddings.weight", "norm.weight"} | contract_names(LLAMA_LAYER, 2)


def test_qwen3_names_follow_the_contract(hf_fixtures):
    _, state = load_hf_state(hf_fixtures / "qwen3")
    qk = ["layers.{i}.attention.q_norm.weight", "layers.{i}.attention.k_norm.weight"]
    assert set(state) == {"tok_embeddings.weight", "norm.weight", "output.weight"} | contract_names(LLAMA_LAYER + qk, 2)
    assert state["layers.1.attention.q_norm.weight"].shape == (24,)


def test_deepseek_experts_are_stacked(hf_fixtures):
    ref = hf_tensors(hf_fixtures / "deepseek_v3")
    _, state = load_hf_state(hf_fixtures / "deepseek_v3")
    mla = ["attention_norm.weight", "ffn_norm.weight", "attention.wq_a.weight", "attention.q_norm.weight",
           "attention.wq_b.weight", "attention.wkv_a.weight", "attention.kv_norm.weight", "attention.wkv_b.weight",
           "attention.wo.weight"]
    dense = ["feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight"]
    moe = ["moe.router.gate.weight", "moe.router.expert_bias", "moe.experts.w1", "moe.experts.w2", "moe.experts.w3",
           "moe.shared_experts.w1.weight", "moe.shared_experts.w2.weight", "moe.shared_experts.w3.weight"]
    expected = {"tok_embeddings.weight", "norm.weight"}
    expected |= {f"layers.{i}.{n}" for i in range(3) for n in mla}
    expected |= {f"layers.0.{n}" for n in dense} | {f"layers.{i}.{n}" for i in (1, 2) for n in moe}
    assert set(state) == expected
    w1, w2 = state["layers.2.moe.experts.w1"], state["layers.2.moe.experts.w2"]
    assert w1.shape == (8, 32, 96) and w2.shape == (8, 96, 32)
    for e in range(8):
        np.testing.assert_array_equal(w1[e], ref[f"model.layers.2.mlp.experts.{e}.gate_proj.weight"])
        np.testing.assert_array_equal(w2[e], ref[f"model.layers.2.mlp.experts.{e}.down_proj.weight"])
    np.testing.assert_array_equal(state["layers.1.moe.router.expert_bias"], ref["model.layers.1.mlp.gate.e_score_correction_bias"])


@pytest.mark.parametrize("arch", ARCHS)
def test_sharded_index_round_trip(hf_fixtures, tmp_path, arch):
    config, state = load_hf_state(hf_fixtures / arch)
    save_hf(tmp_path / "sharded", state, config, max_shard_size="200KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    assert files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in hf_tensors(hf_fixtures / arch).values())
    for f in files:
        assert (tmp_path / "sharded" / f).stat().st_size <= 200_000 + 4096 or len(load_file(str(tmp_path / "sharded" / f))) == 1
    # Reading the sharded directory gives the same mf state; writing it unsharded gives the fixture back.
    config2, state2 = load_hf_state(tmp_path / "sharded")
    assert config2 == config
    assert_identical(state, state2)
    save_hf(tmp_path / "single", state2, config2)
    assert_identical(hf_tensors(hf_fixtures / arch), hf_tensors(tmp_path / "single"))


@pytest.mark.parametrize("arch", [*ARCHS, "glm"])
def test_config_variants_round_trip(hf_builders, arch):
    """Untied/tied, attention and MLP biases, more layers, q_lora_rank null: all derived from config."""
    cfg = dict(hf_builders.small[arch])
    hf = hf_builders.random_state(hf_builders.hf_shapes(cfg))
    mf = hf_to_mf(hf, cfg)
    back = mf_to_hf(mf, cfg)
    assert_identical(hf, back)
    if arch == "llama":
        assert mf["layers.2.attention.wq.bias"].shape == (32,) and mf["layers.2.feed_forward.w2.bias"].shape == (32,)
        assert mf["output.weight"] is hf["lm_head.weight"]  # a rename shares the array
    if arch == "qwen3":
        assert "output.weight" not in mf and mf["layers.0.attention.wo.bias"].shape == (32,)
    if arch == "deepseek_v3":
        assert "layers.0.attention.wq.weight" in mf and "layers.0.attention.wq_a.weight" not in mf
        assert mf["layers.3.moe.shared_experts.w1.weight"].shape == (16, 32)
        assert mf["layers.1.feed_forward.w1.weight"].shape == (48, 32)
        assert mf["layers.3.attention.wkv_a.bias"].shape == (20,)
    if arch == "qwen2":
        assert mf["layers.1.attention.wk.bias"].shape == (16,) and "layers.1.attention.wo.bias" not in mf
    if arch == "mixtral":
        assert mf["layers.2.moe.experts.w2"].shape == (3, 32, 24)
        np.testing.assert_array_equal(mf["layers.2.moe.experts.w2"][1], hf["model.layers.2.block_sparse_moe.experts.1.w2.weight"])
    if arch == "qwen3_moe":  # mlp_only_layers [1], decoder_sparse_step 1: layer 1 dense, 0 and 2 MoE
        assert "layers.1.feed_forward.w1.weight" in mf and "layers.1.moe.router.gate.weight" not in mf
        assert mf["layers.2.moe.experts.w1"].shape == (4, 8, 32) and mf["layers.2.moe.router.gate.weight"].shape == (4, 32)
    if arch == "gpt2":  # Conv1D [in, out] -> [out, in]; c_attn unpacked into wq, wk, wv
        c_attn = hf["transformer.h.1.attn.c_attn.weight"]
        for j, w in enumerate(("wq", "wk", "wv")):
            np.testing.assert_array_equal(mf[f"layers.1.attention.{w}.weight"], c_attn[:, 32 * j:32 * (j + 1)].T)
            np.testing.assert_array_equal(mf[f"layers.1.attention.{w}.bias"],
                                          hf["transformer.h.1.attn.c_attn.bias"][32 * j:32 * (j + 1)])
        np.testing.assert_array_equal(mf["layers.2.feed_forward.w1.weight"], hf["transformer.h.2.mlp.c_fc.weight"].T)
        assert mf["layers.2.feed_forward.w2.weight"].shape == (32, 40) and mf["pos_embeddings.weight"].shape == (40, 32)
        assert "output.weight" not in mf and mf["norm.bias"].shape == (32,)
    if arch == "glm":  # GLM-4-9B: glm4's layout without its post norms
        assert "layers.1.attention_post_norm.weight" not in mf and mf["layers.1.feed_forward.w3.weight"].shape == (40, 32)
    if arch == "glm4":  # gate_up_proj unpacked (gate first), post-attention / post-MLP norms
        gate_up = hf["model.layers.2.mlp.gate_up_proj.weight"]
        np.testing.assert_array_equal(mf["layers.2.feed_forward.w1.weight"], gate_up[:48])
        np.testing.assert_array_equal(mf["layers.2.feed_forward.w3.weight"], gate_up[48:])
        assert mf["layers.0.attention_post_norm.weight"].shape == (32,) and "layers.0.ffn_post_norm.weight" in mf
        assert mf["layers.0.attention.wk.bias"].shape == (24,) and "layers.0.attention.wo.bias" not in mf
    if arch == "qwen2_moe":  # layer 2 dense (mlp_only_layers), the others MoE with a gated shared expert
        assert "layers.2.feed_forward.w1.weight" in mf and "layers.2.moe.shared_expert_gate.weight" not in mf
        assert mf["layers.3.moe.shared_expert_gate.weight"].shape == (1, 32)
        assert mf["layers.3.moe.shared_experts.w2.weight"].shape == (32, 24)
        assert mf["layers.0.attention.wq.bias"].shape == (32,) and "output.weight" not in mf
    if arch == "glm4_moe":  # GQA with q/k norms, DeepSeek's MoE from layer 1 (no MTP layer in this checkpoint)
        assert mf["layers.0.attention.q_norm.weight"].shape == (12,) and "layers.0.feed_forward.w1.weight" in mf
        assert mf["layers.2.moe.router.expert_bias"].shape == (4,) and mf["layers.1.moe.experts.w2"].shape == (4, 32, 8)
        assert not any(k.startswith("mtp.") for k in mf)


def test_new_architectures_follow_the_contract(hf_fixtures):
    ref = hf_tensors(hf_fixtures / "mixtral")
    _, state = load_hf_state(hf_fixtures / "mixtral")
    attn = [n for n in LLAMA_LAYER if "feed_forward" not in n]
    moe = ["layers.{i}.moe.router.gate.weight", "layers.{i}.moe.experts.w1", "layers.{i}.moe.experts.w2",
           "layers.{i}.moe.experts.w3"]
    assert set(state) == {"tok_embeddings.weight", "norm.weight", "output.weight"} | contract_names(attn + moe, 2)
    assert state["layers.1.moe.experts.w3"].shape == (6, 96, 96)
    for e in range(6):
        np.testing.assert_array_equal(state["layers.1.moe.experts.w3"][e], ref[f"model.layers.1.block_sparse_moe.experts.{e}.w3.weight"])
    _, state = load_hf_state(hf_fixtures / "qwen3_moe")
    qk = ["layers.{i}.attention.q_norm.weight", "layers.{i}.attention.k_norm.weight"]
    assert set(state) == {"tok_embeddings.weight", "norm.weight", "output.weight"} | contract_names(attn + qk + moe, 3)
    assert state["layers.0.moe.experts.w2"].shape == (8, 96, 48)
    _, state = load_hf_state(hf_fixtures / "qwen2")   # tied, q/k/v biases only
    bias = ["layers.{i}.attention.wq.bias", "layers.{i}.attention.wk.bias", "layers.{i}.attention.wv.bias"]
    assert set(state) == {"tok_embeddings.weight", "norm.weight"} | contract_names(LLAMA_LAYER + bias, 2)


def test_qwen3_moe_config_names_and_fused_experts(hf_builders):
    cfg = dict(hf_builders.small["qwen3_moe"])
    fused = hf_builders.random_state(hf_builders.hf_shapes(cfg, fused=True), seed=4)
    mf = hf_to_mf(fused, cfg)
    gate_up = fused["model.layers.0.mlp.experts.gate_up_proj"]
    np.testing.assert_array_equal(mf["layers.0.moe.experts.w1"], gate_up[:, :8])
    np.testing.assert_array_equal(mf["layers.0.moe.experts.w3"], gate_up[:, 8:])
    # transformers 5 writes num_local_experts; older configs (and the Hub's Qwen3 MoE) num_experts.
    renamed = {k: v for k, v in cfg.items() if k != "num_experts"} | {"num_local_experts": cfg["num_experts"]}
    per_expert = mf_to_hf(mf, renamed)
    assert_identical(per_expert, mf_to_hf(mf, cfg))
    with pytest.raises(CheckpointError, match="num_experts and num_local_experts disagree"):
        mf_to_hf(mf, dict(cfg, num_local_experts=5))


def test_deepseek_fused_experts_are_read(hf_builders):
    cfg = dict(hf_builders.small["deepseek_v3"], q_lora_rank=12)
    fused = hf_builders.random_state(hf_builders.hf_shapes(cfg, fused=True), seed=3)
    mf = hf_to_mf(fused, cfg)
    gate_up = fused["model.layers.2.mlp.experts.gate_up_proj"]
    np.testing.assert_array_equal(mf["layers.2.moe.experts.w1"], gate_up[:, :8])
    np.testing.assert_array_equal(mf["layers.2.moe.experts.w3"], gate_up[:, 8:])
    np.testing.assert_array_equal(mf["layers.2.moe.experts.w2"], fused["model.layers.2.mlp.experts.down_proj"])
    per_expert = mf_to_hf(mf, cfg)  # written back in the per-expert layout transformers saves
    np.testing.assert_array_equal(per_expert["model.layers.2.mlp.experts.3.up_proj.weight"], gate_up[3, 8:])
    assert "model.layers.2.mlp.experts.gate_up_proj" not in per_expert


def write_hf(path: Path, config: dict, tensors: dict[str, np.ndarray]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def fixture_copy(hf_fixtures, arch, tmp_path, edit_config=None, edit_tensors=None) -> Path:
    config = json.loads((hf_fixtures / arch / "config.json").read_text())
    tensors = hf_tensors(hf_fixtures / arch)
    if edit_config:
        edit_config(config)
    if edit_tensors:
        edit_tensors(tensors)
    return write_hf(tmp_path / f"{arch}_edited", config, tensors)


def test_unknown_model_type(hf_fixtures, tmp_path):
    src = fixture_copy(hf_fixtures, "llama", tmp_path, edit_config=lambda c: c.update(model_type="bloom"))
    with pytest.raises(CheckpointError, match=r"unsupported model_type 'bloom' \(supported: deepseek_v3, glm, glm4, glm4_moe, "
                                              r"gpt2, llama, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe\)"):
        load_hf_state(src)


def test_missing_tensor(hf_fixtures, tmp_path):
    src = fixture_copy(hf_fixtures, "qwen3", tmp_path, edit_tensors=lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model.layers.1.self_attn.k_norm.weight'"):
        load_hf_state(src)


def test_unexpected_tensor(hf_fixtures, tmp_path):
    # The llama fixture ties embeddings, so an lm_head is not described by its config.
    src = fixture_copy(hf_fixtures, "llama", tmp_path,
                       edit_tensors=lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"]}))
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'lm_head.weight'"):
        load_hf_state(src)


def test_shape_mismatch(hf_fixtures, tmp_path):
    src = fixture_copy(hf_fixtures, "deepseek_v3", tmp_path, edit_config=lambda c: c.update(moe_intermediate_size=16))
    with pytest.raises(CheckpointError, match=r"has shape \[32, 96\], config.json implies \[16, 96\]"):
        load_hf_state(src)


def test_quantized_deepseek_config_is_refused_with_the_reason(hf_fixtures, tmp_path):
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    src = fixture_copy(hf_fixtures, "deepseek_v3", tmp_path, edit_config=lambda c: c.update(quantization_config=fp8))
    with pytest.raises(CheckpointError, match=r"quantization_config \('fp8': block-scaled weights .* dequantize"):
        load_hf_state(src)


def test_bad_config_value(hf_fixtures, tmp_path):
    src = fixture_copy(hf_fixtures, "llama", tmp_path, edit_config=lambda c: c.update(hidden_size="96"))
    with pytest.raises(CheckpointError, match=r"hidden_size must be an integer >= 1, got '96'"):
        load_hf_state(src)


def test_mf_to_hf_checks_names_and_shapes(hf_fixtures):
    config, state = load_hf_state(hf_fixtures / "llama")
    with pytest.raises(CheckpointError, match=r"unexpected tensor 'output.weight'"):
        mf_to_hf({**state, "output.weight": state["tok_embeddings.weight"]}, config)
    bad = dict(state)
    bad["layers.0.feed_forward.w2.weight"] = bad["layers.0.feed_forward.w2.weight"][:, :10]
    with pytest.raises(CheckpointError, match=r"'layers.0.feed_forward.w2.weight' has shape \[96, 10\]"):
        mf_to_hf(bad, config)


def test_index_errors(hf_fixtures, tmp_path):
    config, state = load_hf_state(hf_fixtures / "llama")
    out = save_hf(tmp_path / "sharded", state, config, max_shard_size="300KB")
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = next(iter(index["weight_map"]))
    for bad_file, message in (("../escape.safetensors", "not a plain file name"),
                              ("/etc/passwd", "not a plain file name"),
                              ("model-00009-of-00009.safetensors", "does not exist")):
        broken = json.loads(json.dumps(index))
        broken["weight_map"][name] = bad_file
        index_path.write_text(json.dumps(broken))
        with pytest.raises(CheckpointError, match=message):
            load_hf_state(out)
    index_path.write_text(json.dumps(index))
    (out / "escape.safetensors").symlink_to(hf_fixtures / "llama" / "model.safetensors")
    index["weight_map"][name] = "escape.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="resolves outside the checkpoint directory"):
        load_hf_state(out)


def test_truncated_shard(hf_fixtures, tmp_path):
    src = tmp_path / "trunc"
    shutil.copytree(hf_fixtures / "llama", src)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").chmod(0o644)
    (src / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated"):
        load_hf_state(src)


def test_save_hf_refuses_non_empty_dir_and_leaves_it_intact(hf_fixtures, tmp_path):
    config, state = load_hf_state(hf_fixtures / "qwen3")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(CheckpointError, match="not empty"):
        save_hf(out, state, config)
    with pytest.raises(CheckpointError, match="missing tensor"):
        save_hf(out, {k: v for k, v in state.items() if k != "norm.weight"}, config, overwrite=True)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp dir left behind
    save_hf(out, state, config, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


def test_bf16_checkpoint_round_trips_without_ml_dtypes(hf_fixtures, tmp_path):
    """BF16 is carried bit-exactly (numpy has no bfloat16); dtype="float32" widens it exactly."""
    config, state = load_hf_state(hf_fixtures / "llama")
    bf16_state = {k: mf_ckpt.bf16_from_float32(v) for k, v in state.items()}
    save_hf(tmp_path / "bf16", bf16_state, dict(config, dtype="bfloat16"))
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "np") as f:
        sl = f.get_slice("model.norm.weight")
        assert sl.get_dtype() == "BF16" and sl.get_shape() == [96]
    _, again = load_hf_state(tmp_path / "bf16")
    assert again["norm.weight"].dtype == mf_ckpt.BF16
    for k in state:
        assert again[k].tobytes() == bf16_state[k].tobytes()
    save_hf(tmp_path / "bf16_again", again, dict(config, dtype="bfloat16"))
    assert (tmp_path / "bf16" / "model.safetensors").read_bytes() == (tmp_path / "bf16_again" / "model.safetensors").read_bytes()
    _, widened = load_hf_state(tmp_path / "bf16", dtype="float32")
    w = widened["layers.0.attention.wq.weight"]
    assert w.dtype == np.float32
    # The widened value is the float32 whose low 16 bits are zero and whose high bits are the BF16 bits.
    np.testing.assert_array_equal(w.view(np.uint32) >> 16, bf16_state["layers.0.attention.wq.weight"].view(np.uint16))
    np.testing.assert_allclose(w, state["layers.0.attention.wq.weight"], rtol=2**-8)


@pytest.mark.parametrize("arch", ["deepseek_v3", "glm4_moe"])
def test_mtp_layer_converts_both_ways(hf_builders, arch):
    """The checkpoint's MTP layer (DeepSeek's layout) is mf's mtp.0: its own norms and projection,
    a MoE decoder block, the embedding / head copies shared with the main model."""
    cfg = dict(hf_builders.small[arch], num_nextn_predict_layers=1)
    shapes = hf_builders.hf_shapes(cfg)
    hf = hf_builders.random_state({**shapes, **hf_builders.mtp_layer(cfg, shapes)}, seed=5)
    n = cfg["num_hidden_layers"]
    # the copies repeat the shared tensors, as DeepSeek's release does
    hf[f"model.layers.{n}.embed_tokens.weight"] = hf["model.embed_tokens.weight"].copy()
    hf[f"model.layers.{n}.shared_head.head.weight"] = hf["lm_head.weight"].copy()
    mf = hf_to_mf(hf, cfg)
    np.testing.assert_array_equal(mf["mtp.0.eh_proj.weight"], hf[f"model.layers.{n}.eh_proj.weight"])
    np.testing.assert_array_equal(mf["mtp.0.norm.weight"], hf[f"model.layers.{n}.shared_head.norm.weight"])
    np.testing.assert_array_equal(mf["mtp.0.block.moe.experts.w1"][1], hf[f"model.layers.{n}.mlp.experts.1.gate_proj.weight"])
    assert mf["mtp.0.block.attention_norm.weight"].shape == (32,) and "mtp.0.block.moe.router.expert_bias" in mf
    assert not any("embed_tokens" in k or "head" in k for k in mf if k.startswith("mtp."))
    assert_identical(hf, mf_to_hf(mf, cfg))
    # A checkpoint without the copies (GLM-4.6) reads the same; writing restores them.
    copies = (f"model.layers.{n}.embed_tokens.weight", f"model.layers.{n}.shared_head.head.weight")
    without = {k: v for k, v in hf.items() if k not in copies}
    assert set(hf_to_mf(without, cfg)) == set(mf)
    # The causal LM alone (what transformers saves) plans no MTP layer, whatever config.json says.
    main = {k: v for k, v in mf.items() if not k.startswith("mtp.")}
    assert set(mf_to_hf(main, cfg)) == {k for k in hf if not k.startswith(f"model.layers.{n}.")}
    with pytest.raises(CheckpointError, match=f"missing tensor 'model.layers.{n}.hnorm.weight'"):
        hf_to_mf({k: v for k, v in hf.items() if "hnorm" not in k}, cfg)
    with pytest.raises(CheckpointError, match="unexpected tensor"):
        hf_to_mf(hf, dict(cfg, num_nextn_predict_layers=0))


def test_gpt2_checkpoints_of_the_base_model_read(hf_builders):
    """openai-community/gpt2 names its tensors without `transformer.` and carries the attention
    mask buffers; both read, and writing gives transformers' own layout."""
    cfg = dict(hf_builders.small["gpt2"])
    hf = hf_builders.random_state(hf_builders.hf_shapes(cfg), seed=2)
    bare = {k[len("transformer."):]: v for k, v in hf.items()}
    bare["h.0.attn.bias"] = np.ones((1, 1, 40, 40), np.float32)
    bare["h.0.attn.masked_bias"] = np.ones((), np.float32)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        mf = hf_to_mf(bare, cfg)
    assert_identical(mf_to_hf(mf, cfg), hf)
    with pytest.raises(CheckpointError, match="n_embd and hidden_size disagree"):
        hf_to_mf(hf, dict(cfg, hidden_size=48))

