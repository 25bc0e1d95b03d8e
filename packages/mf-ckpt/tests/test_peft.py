"""LoRA adapters <-> PEFT's layout, checked against the format PEFT documents ("PEFT checkpoint
format": `base_model.model.<module>.lora_A.weight` [r, in] / `lora_B.weight` [out, r], update
`lora_alpha / r * B @ A`, `lora_alpha / sqrt(r)` with use_rslora; target_modules a list of names
matched as `name == t or name.endswith("." + t)`). Loading the export with peft itself (and
torch) is tests-integration/hf_interop/test_peft.py."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mf_ckpt
from mf_ckpt.cli import main

RANK, ALPHA = 4, 8.0


def peft_matches(target_modules, name: str) -> bool:
    """PEFT's rule for a list of target modules (check_target_module_exists)."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    return any(name == t or name.endswith("." + t) for t in target_modules)


def hf_linear_modules(state: dict[str, np.ndarray]) -> list[str]:
    return [n[: -len(".weight")] for n, a in state.items() if n.endswith(".weight") and a.ndim == 2]


@pytest.fixture
def base(hf_fixtures, tmp_path) -> Path:
    out = tmp_path / "base_hf"
    shutil.copytree(hf_fixtures / "llama", out)
    return out


def make_adapter(base: Path, out: Path, modules: list[str], seed: int = 0) -> dict[str, np.ndarray]:
    config, state = mf_ckpt.load_hf_state(base)
    rng = np.random.default_rng(seed)
    adapter = {}
    for m in modules:
        out_dim, in_dim = state[m + ".weight"].shape
        adapter[m + ".lora_a"] = rng.standard_normal((RANK, in_dim)).astype(np.float32)
        adapter[m + ".lora_b"] = rng.standard_normal((out_dim, RANK)).astype(np.float32)
    meta = mf_ckpt.make_lora_adapter_meta(rank=RANK, alpha=ALPHA, dropout=0.05, target_modules=".*w[qv]",
                                          modules=modules, base=base, base_kind="hf")
    mf_ckpt.save(str(out), 7, adapter, common={"adapter": meta, "hf_config": config, "step": 7})
    return adapter


ALL_QV = [f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wv")]


def test_export_is_peft_layout(base, tmp_path, capsys):
    adapter = make_adapter(base, tmp_path / "adapter", ALL_QV)
    assert main(["convert", "--from", "mf", "--to", "hf", str(tmp_path / "adapter"), str(tmp_path / "peft")]) == 0
    assert "PEFT LoRA adapter" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "peft").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (RANK, 8, 0.05)
    assert config["target_modules"] == ["q_proj", "v_proj"] and config["base_model_name_or_path"] == str(base)
    assert not config["use_rslora"] and not config["use_dora"] and config["bias"] == "none"
    tensors = load_file(str(tmp_path / "peft" / "adapter_model.safetensors"))
    expected = {f"base_model.model.model.layers.{i}.self_attn.{p}_proj.lora_{ab}.weight"
                for i in range(2) for p in "qv" for ab in "AB"}
    assert set(tensors) == expected
    np.testing.assert_array_equal(tensors["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"],
                                  adapter["layers.1.attention.wv.lora_a"])
    # PEFT's update of each module, computed from the exported files, is mf's merged weight
    _, hf_base = mf_ckpt.load_hf_state(base)
    merged = mf_ckpt.merge_lora(hf_base, adapter, mf_ckpt.read_adapter_meta({"adapter": json.loads(
        (tmp_path / "adapter" / "iteration_00000007" / "common.json").read_text())["common"]["adapter"]}))
    hf_names = mf_ckpt.mf_to_hf(merged, json.loads((base / "config.json").read_text()))
    original = load_file(str(base / "model.safetensors"))
    for module in hf_linear_modules(original):
        a = tensors.get(f"base_model.model.{module}.lora_A.weight")
        want = original[module + ".weight"].astype(np.float64)
        if a is not None:
            assert peft_matches(config["target_modules"], module)
            b = tensors[f"base_model.model.{module}.lora_B.weight"]
            want = want + config["lora_alpha"] / config["r"] * (b.astype(np.float64) @ a.astype(np.float64))
        else:
            assert not peft_matches(config["target_modules"], module), module
        np.testing.assert_allclose(hf_names[module + ".weight"], want, rtol=1e-6, atol=1e-6)


def test_export_names_modules_exactly_when_layers_are_left_out(base, tmp_path):
    make_adapter(base, tmp_path / "adapter", ["layers.1.attention.wq", "layers.0.feed_forward.w2"])
    assert main(["convert", "--from", "mf", "--to", "hf", str(tmp_path / "adapter"), str(tmp_path / "peft")]) == 0
    targets = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())["target_modules"]
    assert targets == ["model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj"]
    modules = hf_linear_modules(load_file(str(base / "model.safetensors")))
    assert [m for m in modules if peft_matches(targets, m)] == sorted(targets, key=modules.index)


def write_peft(directory: Path, base: Path, tensors: dict, **config) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    full = {"peft_type": "LORA", "r": RANK, "lora_alpha": 16, "target_modules": ["q_proj"], "bias": "none",
            "base_model_name_or_path": str(base), **config}
    (directory / "adapter_config.json").write_text(json.dumps(full))
    return directory


def peft_tensors(base: Path, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(2):
        module = f"base_model.model.model.layers.{i}.self_attn.q_proj"
        out[module + ".lora_A.weight"] = rng.standard_normal((RANK, 96)).astype(np.float32)
        out[module + ".lora_B.weight"] = rng.standard_normal((96, RANK)).astype(np.float32)
    return out


@pytest.mark.parametrize("rslora", [False, True])
def test_import_keeps_peft_scaling(base, tmp_path, rslora):
    tensors = peft_tensors(base)
    write_peft(tmp_path / "peft", base, tensors, use_rslora=rslora)
    assert main(["convert", "--from", "hf", "--to", "mf", str(tmp_path / "peft"), str(tmp_path / "mf")]) == 0
    meta, adapter, common = mf_ckpt.load_lora_adapter(tmp_path / "mf")
    assert meta["rank"] == RANK and meta["base"] == str(base) and meta["base_kind"] == "hf"
    assert meta["modules"] == ["layers.0.attention.wq", "layers.1.attention.wq"]
    assert all(re.fullmatch(meta["target_modules"], m) for m in meta["modules"])
    scale = 16 / math.sqrt(RANK) if rslora else 16 / RANK
    assert meta["alpha"] / meta["rank"] == pytest.approx(scale)
    np.testing.assert_array_equal(adapter["layers.1.attention.wq.lora_b"],
                                  tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"])
    # merged through the recorded base: W + scale * B @ A, as PEFT computes it
    _, merged = mf_ckpt.load_lora_merged_state(tmp_path / "mf")
    _, plain = mf_ckpt.load_hf_state(base)
    a = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].astype(np.float64)
    b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"].astype(np.float64)
    np.testing.assert_allclose(merged["layers.0.attention.wq.weight"], plain["layers.0.attention.wq.weight"] + scale * b @ a,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(merged["layers.0.attention.wk.weight"], plain["layers.0.attention.wk.weight"])
    # and back to PEFT: the same tensors under the same names
    assert main(["convert", "--from", "mf", "--to", "hf", str(tmp_path / "mf"), str(tmp_path / "again")]) == 0
    back = load_file(str(tmp_path / "again" / "adapter_model.safetensors"))
    assert sorted(back) == sorted(tensors) and all(np.array_equal(back[k], tensors[k]) for k in tensors)


def test_import_without_a_local_base_needs_its_config(base, tmp_path, capsys):
    write_peft(tmp_path / "peft", base, peft_tensors(base), base_model_name_or_path="meta-llama/Llama-2-7b-hf")
    assert main(["convert", "--from", "hf", "--to", "mf", str(tmp_path / "peft"), str(tmp_path / "mf")]) == 2
    assert "give its config.json with --hf-config" in capsys.readouterr().err
    assert main(["convert", "--from", "hf", "--to", "mf", "--hf-config", str(base), str(tmp_path / "peft"),
                 str(tmp_path / "mf")]) == 0
    meta, _, _ = mf_ckpt.load_lora_adapter(tmp_path / "mf")
    assert meta["base"] is None   # merge it explicitly: mf-ckpt merge-lora BASE ADAPTER OUT


@pytest.mark.parametrize("config,tensors,needle", [
    ({"use_dora": True}, None, "use_dora True is not supported: DoRA"),
    ({"bias": "all"}, None, "bias 'all' is not supported"),
    ({"rank_pattern": {"q_proj": 8}}, None, "rank_pattern"),
    ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
    ({"peft_type": "IA3"}, None, "peft_type 'IA3' is not supported"),
    ({"r": 0}, None, "r must be a positive integer"),
    ({}, {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((RANK, 96), np.float32)},
     "has only one of lora_a / lora_b"),
    ({}, {"base_model.model.model.layers.0.self_attn.rotary.lora_A.weight": np.zeros((RANK, 96), np.float32)},
     "module 'model.layers.0.self_attn.rotary' is not a module"),
    ({}, {"base_model.model.model.embed_tokens.lora_embedding_A": np.zeros((RANK, 600), np.float32)},
     "is not a LoRA weight PEFT saves for a Linear module"),
    ({}, {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": np.zeros((RANK, 95), np.float32),
          "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": np.zeros((96, RANK), np.float32)},
     "do not fit a rank-4 adapter"),
])
def test_import_refuses_what_mf_lora_cannot_hold(base, tmp_path, capsys, config, tensors, needle):
    write_peft(tmp_path / "peft", base, tensors if tensors is not None else peft_tensors(base), **config)
    assert main(["convert", "--from", "hf", "--to", "mf", str(tmp_path / "peft"), str(tmp_path / "mf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mf-ckpt: error: ") and needle in err[0], err
    assert not (tmp_path / "mf").exists()


def test_a_pickled_adapter_is_never_read(base, tmp_path, capsys):
    (tmp_path / "peft").mkdir()
    (tmp_path / "peft" / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (tmp_path / "peft" / "adapter_model.bin").write_bytes(b"\x80\x04not read")
    assert main(["convert", "--from", "hf", "--to", "mf", str(tmp_path / "peft"), str(tmp_path / "mf")]) == 2
    assert "adapter_model.bin is a pickle, which mf never loads" in capsys.readouterr().err
