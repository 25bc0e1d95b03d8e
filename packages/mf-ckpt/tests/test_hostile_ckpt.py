"""The hostile pass of issue 31 on `mf-ckpt` (the real entry point, `main(argv)`, which `mf ckpt`
also runs): each row ends in one `mf-ckpt: error:` line, exit 2, and no output directory.

- merge-lora of an adapter whose alpha / rank overflows the weights (lora_alpha 1e308): it wrote
  28 of 38 tensors inf/NaN with exit 0;
- convert --from hf --iteration -1 or 10^20: it left a checkpoint nothing could load;
- convert of a config.json the model would refuse or run wrongly (max_position_embeddings 0,
  rope_theta "big", rms_norm_eps NaN): it was accepted;
- a PEFT adapter whose target_modules / layers_to_transform select other modules than its weights
  (absent from the model, [], 5, layers_to_transform [0]): it was converted as if every module with
  weights were adapted, where PEFT itself applies only what the config selects.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import mf_ckpt
from mf_ckpt.cli import main


def _adapter(base: Path, out: Path, alpha: float) -> None:
    """An mf LoRA adapter (rank 2) on every attention projection of the llama fixture."""
    config, state = mf_ckpt.load_hf_state(base)
    modules = [f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")]
    rng = np.random.default_rng(0)
    adapter = {}
    for m in modules:
        out_dim, in_dim = state[m + ".weight"].shape
        adapter[m + ".lora_a"] = rng.standard_normal((2, in_dim)).astype(np.float32)
        adapter[m + ".lora_b"] = rng.standard_normal((out_dim, 2)).astype(np.float32)
    meta = mf_ckpt.make_lora_adapter_meta(rank=2, alpha=alpha, target_modules=".*attention.*", modules=modules,
                                          base=base, base_kind="hf")
    mf_ckpt.save(str(out), 3, adapter, common={"adapter": meta, "hf_config": config, "step": 3})


def _edited_hf(src: Path, out: Path, **changes) -> Path:
    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    config.update(changes)
    (out / "config.json").write_text(json.dumps(config))       # NaN written as JSON's NaN, as Python does
    return out


def _peft(base: Path, out: Path, **config_changes) -> Path:
    """A PEFT directory (exported by mf from an adapter on every q/v projection), its
    adapter_config.json then edited."""
    _adapter_qv = out.parent / "qv_adapter"
    config, state = mf_ckpt.load_hf_state(base)
    modules = [f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wv")]
    adapter = {}
    for m in modules:
        out_dim, in_dim = state[m + ".weight"].shape
        adapter[m + ".lora_a"] = np.full((2, in_dim), 0.1, np.float32)
        adapter[m + ".lora_b"] = np.full((out_dim, 2), 0.1, np.float32)
    meta = mf_ckpt.make_lora_adapter_meta(rank=2, alpha=4.0, target_modules=".*w[qv]", modules=modules,
                                          base=base, base_kind="hf")
    mf_ckpt.save(str(_adapter_qv), 3, adapter, common={"adapter": meta, "hf_config": config, "step": 3})
    assert main(["convert", "--from", "mf", "--to", "hf", str(_adapter_qv), str(out)]) == 0
    cfg = json.loads((out / "adapter_config.json").read_text())
    cfg.update(config_changes)
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    return out


def _case(kind: str, tmp: Path, llama: Path) -> list[str]:
    out = str(tmp / "out")
    if kind == "merge-lora-alpha-1e308":
        _adapter(llama, tmp / "adapter", 1e308)
        return ["merge-lora", str(llama), str(tmp / "adapter"), out]
    if kind == "merge-lora-alpha-1e308-to-hf":
        _adapter(llama, tmp / "adapter", 1e308)
        return ["merge-lora", str(llama), str(tmp / "adapter"), out, "--to", "hf"]
    if kind.startswith("iteration"):
        return ["convert", "--from", "hf", "--to", "mf", str(llama), out, "--iteration", kind.split("=")[1]]
    if kind.startswith("config:"):
        key, value = kind.split(":")[1].split("=")
        if value == "5000-digits":       # written as text: Python's json would not write it either
            edited = _edited_hf(llama, tmp / "edited")
            text = (edited / "config.json").read_text()
            (edited / "config.json").write_text(text.replace(f'"{key}": ', f'"{key}": {"9" * 5000}, "_was": ', 1))
        else:
            edited = _edited_hf(llama, tmp / "edited", **{key: json.loads(value)})
        return ["convert", "--from", "hf", "--to", "mf", str(edited), out]
    if kind.startswith("peft:"):
        key, value = kind.split(":")[1].split("=")
        peft = _peft(llama, tmp / "peft", **{key: json.loads(value)})
        return ["convert", "--from", "hf", "--to", "mf", str(peft), out, "--hf-config", str(llama)]
    raise AssertionError(kind)


# (id, needle of the one error line)
CASES = [
    ("merge-lora-alpha-1e308", "merging the adapter (alpha / rank = 5e+307) gives"),
    ("merge-lora-alpha-1e308-to-hf", "non-finite value(s) where the base weight is finite; nothing was written"),
    ("iteration=-1", "--iteration must be an integer in [0, 999999999999999999]"),
    ("iteration=100000000000000000000", "--iteration must be an integer in [0, 999999999999999999]"),
    ("config:max_position_embeddings=0", "max_position_embeddings must be an integer >= 1, got 0"),
    ('config:rope_theta="big"', "rope_theta must be a finite number > 0, got 'big'"),
    ("config:rms_norm_eps=NaN", "rms_norm_eps must be a finite number > 0, got nan"),
    ("config:vocab_size=5000-digits", "config.json is not valid JSON (Exceeds the limit (4300 digits)"),
    ('peft:target_modules=["no_such_proj"]', "holds LoRA weights for 4 module(s) its target_modules ['no_such_proj']"),
    ("peft:target_modules=[]", "holds LoRA weights for 4 module(s) its target_modules []"),
    ("peft:target_modules=5", "target_modules must be a regular expression or a list of module names, got 5"),
    ("peft:layers_to_transform=[0]", "layers_to_transform [0] does not select ('model.layers.1.self_attn.q_proj'"),
    ('peft:target_modules="(unclosed"', "is not a regular expression"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile(case, hf_fixtures, tmp_path, capsys):
    kind, needle = case
    argv = _case(kind, tmp_path, hf_fixtures / "llama")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mf-ckpt: error: ") and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_a_peft_config_that_selects_its_weights_still_converts(hf_fixtures, tmp_path, capsys):
    """The same adapter with configs PEFT reads as selecting exactly its modules: a regex, the
    leaf names, full names, layers_to_transform naming every layer."""
    llama = hf_fixtures / "llama"
    for i, change in enumerate([{"target_modules": r".*\.(q|v)_proj"}, {"target_modules": ["q_proj", "v_proj"]},
                                {"target_modules": ["q_proj", "v_proj"], "layers_to_transform": [0, 1]},
                                {"target_modules": "all-linear"}]):
        peft = _peft(llama, tmp_path / f"peft{i}", **change)
        assert main(["convert", "--from", "hf", "--to", "mf", str(peft), str(tmp_path / f"out{i}"), "--hf-config",
                     str(llama)]) == 0, (change, capsys.readouterr().err)
