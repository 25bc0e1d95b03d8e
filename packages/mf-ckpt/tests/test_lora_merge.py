"""LoRA adapters: the marking, `merge_lora` (numpy), and `mf-ckpt merge-lora BASE ADAPTER OUT` with
the transformers-written llama fixture as the base (mf and HF outputs, errors that write nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import mf_ckpt
from mf_ckpt.cli import main

MODULES = ["layers.0.attention.wq", "layers.1.feed_forward.w2"]


def adapter_for(base: dict, rank: int = 3, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for m in MODULES:
        o, i = base[m + ".weight"].shape
        out[m + ".lora_a"] = rng.normal(0, 0.1, (rank, i)).astype(np.float32)
        out[m + ".lora_b"] = rng.normal(0, 0.1, (o, rank)).astype(np.float32)
    return out


def meta_for(rank=3, alpha=6.0, base=None, **kw):
    return mf_ckpt.make_lora_adapter_meta(rank=rank, alpha=alpha, target_modules=".*wq|.*w2", modules=MODULES,
                                          base=base, base_kind="hf" if base else None, **kw)


@pytest.fixture(scope="module")
def llama(hf_fixtures):
    config, state = mf_ckpt.load_hf_state(str(hf_fixtures / "llama"))
    return hf_fixtures / "llama", config, state


@pytest.fixture(scope="module")
def adapter_ckpt(tmp_path_factory, llama):
    base_dir, config, state = llama
    adapter = adapter_for(state)
    path = tmp_path_factory.mktemp("adapter") / "ckpt"
    mf_ckpt.save(str(path), 40, adapter, {f"exp_avg.{n}": v for n, v in adapter.items()},
                 common={"step": 40, "hf_config": config, "adapter": meta_for(base=base_dir)})
    return path, adapter


def test_merge_lora_is_w_plus_scaled_ba(llama):
    _, _, state = llama
    adapter = adapter_for(state)
    merged = mf_ckpt.merge_lora(state, adapter, meta_for())
    for m in MODULES:
        expected = state[m + ".weight"] + 2.0 * adapter[m + ".lora_b"] @ adapter[m + ".lora_a"]
        np.testing.assert_allclose(merged[m + ".weight"], expected, rtol=1e-6, atol=1e-7)
    untouched = [n for n in state if n.rsplit(".", 1)[0] not in MODULES]
    assert all(merged[n] is state[n] for n in untouched)
    bf16 = {n: mf_ckpt.bf16_from_float32(v) for n, v in state.items()}  # BF16 stays BF16
    out = mf_ckpt.merge_lora(bf16, adapter, meta_for())
    w = "layers.0.attention.wq.weight"
    assert out[w].dtype == mf_ckpt.BF16
    np.testing.assert_allclose(mf_ckpt.to_float32(out[w]), merged[w], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("break_it, message", [
    (lambda b, a, m: a.update({"layers.0.attention.wq.lora_a": np.zeros((3, 5), np.float32)}),
     "module 'layers.0.attention.wq': base weight [96, 96], lora_a [3, 5], lora_b [96, 3] do not fit a rank-3 adapter"),
    (lambda b, a, m: b.pop("layers.1.feed_forward.w2.weight"),
     "the base has no weight 'layers.1.feed_forward.w2.weight' for adapted module(s)"),
    (lambda b, a, m: a.pop("layers.0.attention.wq.lora_b"), "module 'layers.0.attention.wq' has only one of lora_a"),
    (lambda b, a, m: a.update({"norm.weight": np.ones(96, np.float32)}), "tensor 'norm.weight' is not a LoRA tensor"),
    (lambda b, a, m: m.update({"type": "ia3"}), "adapter type 'ia3' is not supported"),
    (lambda b, a, m: m.update({"rank": 4}), "do not fit a rank-4 adapter"),
])
def test_merge_lora_errors_are_one_line(llama, break_it, message):
    _, _, state = llama
    base, adapter, meta = dict(state), adapter_for(state), meta_for()
    break_it(base, adapter, meta)
    with pytest.raises(mf_ckpt.CheckpointError) as err:
        mf_ckpt.merge_lora(base, adapter, meta)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_merge_lora_cli_writes_mf_and_hf(llama, adapter_ckpt, tmp_path, capsys):
    base_dir, config, state = llama
    path, adapter = adapter_ckpt
    expected = mf_ckpt.merge_lora(state, adapter, meta_for())
    assert main(["merge-lora", str(base_dir), str(path), str(tmp_path / "mf")]) == 0
    assert "merged 2 LoRA module(s) (rank 3, alpha 6)" in capsys.readouterr().out
    got = {n: np.zeros(v.shape, np.float32) for n, v in state.items()}
    result = mf_ckpt.load(str(tmp_path / "mf"), got)
    assert result.iteration == 40 and result.common["hf_config"] == config
    assert result.common["merged_lora"]["modules"] == 2
    assert all(np.array_equal(got[n], expected[n]) for n in state)
    assert main(["merge-lora", "--to", "hf", "--max-shard-size", "100KB", str(base_dir), str(path),
                 str(tmp_path / "hf")]) == 0
    hf_config, hf_state = mf_ckpt.load_hf_state(str(tmp_path / "hf"))
    assert hf_config == config and (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert all(np.array_equal(hf_state[n], expected[n]) for n in state)
    assert (tmp_path / "hf" / "generation_config.json").is_file()
    # merged on load through the recorded base: the same weights
    _, merged = mf_ckpt.load_lora_merged_state(str(path))
    assert all(np.array_equal(merged[n], expected[n]) for n in state)


def test_merge_lora_cli_errors_write_nothing(llama, adapter_ckpt, tmp_path, capsys, hf_fixtures):
    base_dir, config, state = llama
    path, adapter = adapter_ckpt
    out = tmp_path / "out"

    def fails(args, needle):
        assert main(["merge-lora", *map(str, args)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("mf-ckpt: error: ") and needle in err[0], err
        assert not out.exists() and not list(tmp_path.glob(".out.*"))

    fails([base_dir, base_dir, out], "not a LoRA adapter checkpoint (its common.json has no adapter marking)")
    fails([hf_fixtures / "deepseek_v3", path, out], "the base has no weight")  # another model: names differ
    fails([hf_fixtures / "qwen3", path, out], "module 'layers.0.attention.wq': base weight")  # shapes differ
    fails([path, path, out], "the base is itself a LoRA adapter checkpoint")
    fails([base_dir, path, out, "--max-shard-size", "1MB"], "--hf-config and --max-shard-size apply to --to hf only")
    small = {n: v for n, v in state.items()}
    small["layers.0.attention.wq.weight"] = np.zeros((8, 96), np.float32)
    mf_ckpt.save(str(tmp_path / "other"), 1, small, None, common={"hf_config": config})
    fails([tmp_path / "other", path, out], "module 'layers.0.attention.wq': base weight [8, 96], lora_a [3, 96]")
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["merge-lora", str(base_dir), str(path), str(out)]) == 2
    assert "directory is not empty" in capsys.readouterr().err and (out / "keep.txt").read_text() == "mine"


def test_marking_is_validated_and_a_missing_base_is_explained(tmp_path, llama, adapter_ckpt):
    path, adapter = adapter_ckpt
    assert mf_ckpt.read_adapter_meta({"step": 1}) is None
    with pytest.raises(mf_ckpt.CheckpointError, match="adapter rank must be a positive integer"):
        mf_ckpt.read_adapter_meta({"adapter": {"type": "lora", "rank": 0, "alpha": 1.0}})
    moved = tmp_path / "moved"
    mf_ckpt.save(str(moved), 1, adapter, None, common={"adapter": meta_for(base=tmp_path / "gone")})
    with pytest.raises(mf_ckpt.CheckpointError, match="the adapter's base .*gone does not exist here; merge it"):
        mf_ckpt.load_lora_merged_state(str(moved))
    assert json.loads((Path(path) / "iteration_00000040" / "common.json").read_text())["common"]["adapter"]["rank"] == 3
