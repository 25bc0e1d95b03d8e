"""Checkpoints that stand on their own: the tokenizer (and generation config) a checkpoint carries,
through save, rotation, verify, merge, convert in both directions and into transformers; the
architecture inferred from config.json; outputs that follow the umask; help for every flag;
`inspect` of an HF directory by its own names; shapes checked against a config without data."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mf_ckpt
from mf_ckpt import SaveOptions, Saver, find_tokenizer, load_hf_state, run_threaded, shard_array, tokenizer_assets
from mf_ckpt.cli import build_parser, main

SCRIPT = Path(sys.executable).with_name("mf-ckpt")
GENERATION = {"do_sample": False, "max_new_tokens": 24, "eos_token_id": 2, "bos_token_id": 1}


def one_line(capsys, *needles) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mf-ckpt: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def trained(hf_fixtures, tmp_path, spm_files):
    """The llama fixture saved as mf-trainer saves it: 2 threaded ranks, split weights, the model
    section (with mf-only keys) as hf_config, generation defaults and the tokenizer's files."""
    config, state = load_hf_state(hf_fixtures / "llama")
    section = {**config, "seq_length": 64, "compute_dtype": "float32"}
    del section["architectures"], section["dtype"]

    def body(comm):
        st = {k: shard_array(v, 0, comm.rank, 2) if v.ndim == 2 else v for k, v in state.items()}
        saver = Saver(SaveOptions(save_path=str(tmp_path / "run" / "checkpoint"), save_max=1, async_save=True), comm)
        for step in (1, 2):
            saver.save(step, st, common={"step": step, "hf_config": section, "hf_generation_config": GENERATION},
                       assets=tokenizer_assets(spm_files))
        saver.finalize()

    run_threaded(2, body)
    return {"ckpt": tmp_path / "run" / "checkpoint", "state": state, "config": config}


def test_every_iteration_carries_the_tokenizer_checksummed(trained, spm_files, capsys):
    ckpt = trained["ckpt"]
    assert sorted(p.name for p in ckpt.iterdir()) == ["iteration_00000002", "latest_checkpointed_iteration.txt"]
    it = ckpt / "iteration_00000002"
    assert sorted(p.name for p in (it / "tokenizer").iterdir()) == sorted(spm_files)
    meta = json.loads((it / "metadata.json").read_text())
    assert meta["assets"]["tokenizer/tokenizer.model"]["bytes"] == len(spm_files["tokenizer.model"])
    found = find_tokenizer(ckpt)
    assert found.kind == "sentencepiece" and found.path == str(it / "tokenizer" / "tokenizer.model")
    assert found.files["tokenizer_config.json"].read_bytes() == spm_files["tokenizer_config.json"]
    # one iteration directory copied anywhere still carries it
    assert find_tokenizer(it).path == found.path
    assert main(["verify", str(ckpt)]) == 0
    assert "2 carried file(s) match theirs" in capsys.readouterr().out
    assert main(["inspect", str(ckpt)]) == 0
    assert "tokenizer/tokenizer.model" in capsys.readouterr().out


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage,needles", [
    (lambda it: _flip(it / "tokenizer" / "tokenizer.model"), ["tokenizer.model", "asset checksum mismatch"]),
    (lambda it: (it / "tokenizer" / "tokenizer.model").unlink(), ["asset 'tokenizer/tokenizer.model'", "missing"]),
    (lambda it: (it / "tokenizer" / "tokenizer_config.json").write_text("{}"), ["tokenizer_config.json", "2 bytes"]),
    (lambda it: _edit_metadata(it, lambda m: m.update(assets=[1])), ["metadata.json", "assets must be an object"]),
    (lambda it: _edit_metadata(it, lambda m: m["assets"].update({"../../etc/passwd": {"bytes": 1, "crc32c": "00000000"}})),
     ["metadata.json", "asset name '../../etc/passwd'"]),
    (lambda it: _edit_metadata(it, lambda m: m["assets"].update({"tokenizer/x": {"bytes": -1}})),
     ["metadata.json", "assets['tokenizer/x']"]),
])
def test_a_damaged_carried_file_is_one_line(trained, tmp_path, capsys, damage, needles):
    it = trained["ckpt"] / "iteration_00000002"
    damage(it)
    for argv in (["verify", str(trained["ckpt"])], ["convert", "--from", "mf", "--to", "hf", str(trained["ckpt"]),
                                                    str(tmp_path / "hf")],
                 ["merge", str(trained["ckpt"]), str(tmp_path / "merged")]):
        assert main(argv) == 2
        one_line(capsys, *needles)
    assert not (tmp_path / "hf").exists() and not (tmp_path / "merged").exists()
    with pytest.raises(mf_ckpt.CheckpointError):
        find_tokenizer(trained["ckpt"])


def _edit_metadata(it: Path, fn) -> None:
    meta = json.loads((it / "metadata.json").read_text())
    fn(meta)
    (it / "metadata.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("name", ["tokenizer.model", "a/b/c", "../x/y", ".hidden/x", "tokenizer/.x", "/abs/x"])
def test_asset_names_stay_inside_the_checkpoint(tmp_path, name):
    with pytest.raises(mf_ckpt.CheckpointError, match="asset name"):
        mf_ckpt.save(str(tmp_path / "ck"), 1, {"w": np.ones(3, np.float32)}, assets={name: b"x"})
    assert not (tmp_path / "ck" / "latest_checkpointed_iteration.txt").exists()


def test_missing_tokenizer_file_fails_the_save_on_every_rank(tmp_path):
    def body(comm):
        with pytest.raises(mf_ckpt.CheckpointError, match="cannot read asset"):
            mf_ckpt.save(str(tmp_path / "ck"), 1, {"w": np.ones(4, np.float32)}, comm=comm,
                         assets={"tokenizer/tokenizer.model": tmp_path / "nowhere.model"})

    run_threaded(2, body)
    assert not (tmp_path / "ck" / "latest_checkpointed_iteration.txt").exists()


def test_export_to_hf_writes_what_transformers_reads(trained, spm_files, tmp_path, capsys):
    """config.json without mf-only keys, generation_config.json, tokenizer.json built from
    tokenizer.model (kept beside it) and tokenizer_config.json naming PreTrainedTokenizerFast
    (model_max_length added), all read back by transformers itself."""
    out = tmp_path / "hf"
    assert main(["convert", "--from", "mf", "--to", "hf", str(trained["ckpt"]), str(out)]) == 0
    said = capsys.readouterr().out
    assert "generation_config.json" in said
    assert "tokenizer: tokenizer.json, tokenizer.model, tokenizer_config.json" in said
    config = json.loads((out / "config.json").read_text())
    assert "seq_length" not in config and "compute_dtype" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"
    assert json.loads((out / "generation_config.json").read_text()) == GENERATION
    assert (out / "tokenizer.model").read_bytes() == spm_files["tokenizer.model"]
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["model_max_length"] == trained["config"]["max_position_embeddings"]
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    transformers = pytest.importorskip("transformers", reason="transformers (mf-ckpt's test extra) reads the export")
    spm = pytest.importorskip("sentencepiece")
    assert transformers.AutoConfig.from_pretrained(out).to_dict()["hidden_size"] == config["hidden_size"]
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert (generation.do_sample, generation.max_new_tokens, generation.eos_token_id) == (False, 24, 2)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    sp = spm.SentencePieceProcessor(model_proto=spm_files["tokenizer.model"])
    for text in ["The for statement", "A class definition defines a class.\n\nIt  has   spaces", "x = [1, 2]"]:
        assert tok(text)["input_ids"] == sp.Encode(text)
    assert tok.eos_token_id == sp.eos_id() and tok.model_max_length == config["max_position_embeddings"]


ALL_ARCHS = ["llama", "qwen2", "qwen3", "deepseek_v3", "mixtral", "qwen3_moe", "gpt2", "glm4", "qwen2_moe", "glm4_moe"]


def test_every_architecture_names_the_transformers_class_its_fixture_declares(hf_fixtures):
    """An export whose config lacks `architectures` gets the class transformers saved the fixture with."""
    from mf_ckpt import supported_model_types
    from mf_ckpt.hf.convert import ARCHITECTURES
    from mf_ckpt.hf.io import export_config

    assert sorted(supported_model_types()) == sorted([*ALL_ARCHS, "glm"])   # glm: no shared fixture (hf_interop makes one)
    for arch in ALL_ARCHS:
        config = json.loads((hf_fixtures / arch / "config.json").read_text())
        assert [ARCHITECTURES[arch].hf_class] == config["architectures"], arch
        bare = {k: v for k, v in config.items() if k != "architectures"}
        assert export_config(bare, [])["architectures"] == config["architectures"]


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_hf_round_trip_infers_the_architecture_and_carries_the_tokenizer(hf_fixtures, hf_tokenizer_files, tmp_path,
                                                                         capsys, arch):
    src = tmp_path / "src"
    shutil.copytree(hf_fixtures / arch, src)
    for name, data in hf_tokenizer_files.items():
        (src / name).write_bytes(data)
    assert main(["convert", "--from", "hf", "--to", "mf", str(src), str(tmp_path / "mf")]) == 0   # no --arch
    assert "tokenizer: chat_template.jinja, tokenizer.json, tokenizer_config.json" in capsys.readouterr().out
    carried = find_tokenizer(tmp_path / "mf")
    assert carried.kind == "hf" and carried.path == str(tmp_path / "mf" / "iteration_00000000" / "tokenizer")
    info = json.loads(subprocess.run([str(SCRIPT), "inspect", "--json", str(tmp_path / "mf")], capture_output=True,
                                     text=True, check=True).stdout)
    assert info["common"]["hf_config"]["model_type"] == arch and "hf_generation_config" in info["common"]
    assert sorted(info["assets"]) == sorted(f"tokenizer/{n}" for n in hf_tokenizer_files)
    assert main(["convert", "--from", "mf", "--to", "hf", str(tmp_path / "mf"), str(tmp_path / "back")]) == 0
    for name in ("config.json", "generation_config.json"):
        assert json.loads((tmp_path / "back" / name).read_text()) == json.loads((src / name).read_text())
    for name, data in hf_tokenizer_files.items():
        if name != "tokenizer_config.json":   # gains nothing: it already says model_max_length
            assert (tmp_path / "back" / name).read_bytes() == data
    assert json.loads((tmp_path / "back" / "tokenizer_config.json").read_bytes()) == \
        json.loads(hf_tokenizer_files["tokenizer_config.json"])


def test_an_explicit_arch_that_disagrees_is_one_line(hf_fixtures, tmp_path, capsys):
    assert main(["convert", "--from", "hf", "--to", "mf", "--arch", "qwen3", str(hf_fixtures / "llama"),
                 str(tmp_path / "o")]) == 2
    one_line(capsys, "config.json has model_type 'llama', not --arch 'qwen3'")
    assert not (tmp_path / "o").exists()


def test_merge_and_merge_lora_carry_the_tokenizer(trained, spm_files, tmp_path):
    assert main(["merge", str(trained["ckpt"]), str(tmp_path / "merged")]) == 0
    found = find_tokenizer(tmp_path / "merged")
    assert found.path == str(tmp_path / "merged" / "tokenizer" / "tokenizer.model")
    assert json.loads((tmp_path / "merged" / "common.json").read_text())["assets"]["tokenizer/tokenizer.model"]
    # an adapter trained on the checkpoint: its merge carries the run's tokenizer
    state = trained["state"]
    adapter = {"layers.0.attention.wq.lora_a": np.ones((2, state["layers.0.attention.wq.weight"].shape[1]), np.float32),
               "layers.0.attention.wq.lora_b": np.ones((state["layers.0.attention.wq.weight"].shape[0], 2), np.float32)}
    meta = mf_ckpt.make_lora_adapter_meta(rank=2, alpha=4.0, target_modules=".*wq", modules=["layers.0.attention.wq"],
                                          base=trained["ckpt"], base_kind="mf", base_iteration=2)
    mf_ckpt.save(str(tmp_path / "adapter"), 3, adapter, common={"adapter": meta}, assets=tokenizer_assets(spm_files))
    assert main(["merge-lora", str(trained["ckpt"]), str(tmp_path / "adapter"), str(tmp_path / "lora-mf")]) == 0
    assert find_tokenizer(tmp_path / "lora-mf").files["tokenizer.model"].read_bytes() == spm_files["tokenizer.model"]
    assert main(["merge-lora", str(trained["ckpt"]), str(tmp_path / "adapter"), str(tmp_path / "lora-hf"), "--to",
                 "hf"]) == 0
    assert (tmp_path / "lora-hf" / "tokenizer.model").read_bytes() == spm_files["tokenizer.model"]
    # merge-lora --to hf exports the sentencepiece tokenizer as convert --to hf does
    assert json.loads((tmp_path / "lora-hf" / "tokenizer.json").read_text())["model"]["type"] == "Unigram"
    assert json.loads((tmp_path / "lora-hf" / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"
    assert json.loads((tmp_path / "lora-hf" / "generation_config.json").read_text()) == GENERATION


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_outputs_follow_the_umask(hf_fixtures, hf_tokenizer_files, tmp_path, umask):
    """Directories 0777 and files 0666 less the umask, as mkdir and open make them (not
    tempfile's 0700 / 0600), for every output of the console script."""
    src = tmp_path / "src"
    shutil.copytree(hf_fixtures / "llama", src)
    for name, data in hf_tokenizer_files.items():
        (src / name).write_bytes(data)
    outputs = {"mf": ["convert", "--from", "hf", "--to", "mf", src, tmp_path / "mf"],
               "hf": ["convert", "--from", "mf", "--to", "hf", tmp_path / "mf", tmp_path / "hf"],
               "merged": ["merge", tmp_path / "mf", tmp_path / "merged"]}
    for argv in outputs.values():
        r = subprocess.run([str(SCRIPT), *map(str, argv)], capture_output=True, text=True, timeout=120,
                           preexec_fn=lambda: os.umask(umask))
        assert r.returncode == 0, r.stderr
    for name in outputs:
        root = tmp_path / name
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            expected = (0o777 if path.is_dir() else 0o666) & ~umask
            assert mode == expected, f"{path.relative_to(tmp_path)}: {oct(mode)}, expected {oct(expected)}"


def test_every_option_and_argument_has_help():
    import argparse

    def walk(parser, prog):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{prog} {name}")
            elif not isinstance(action, argparse._HelpAction):
                yield prog, action

    missing = [f"{prog}: {'/'.join(a.option_strings) or a.dest}" for prog, a in walk(build_parser(), "mf-ckpt")
               if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_inspect_an_hf_directory_shows_its_own_names(hf_fixtures, capsys):
    assert main(["inspect", str(hf_fixtures / "deepseek_v3")]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  model.") or line.startswith("  lm_")}
    assert "-> layers.0.attention.wkv_a.weight" in lines["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]
    assert "-> layers.1.moe.experts.w1" in lines["model.layers.1.mlp.experts.0.gate_proj.weight"]
    assert "layers.0.attention.wkv_a.weight" not in lines   # mf names only after the arrow
    info = json.loads(subprocess.run([str(SCRIPT), "inspect", "--json", str(hf_fixtures / "qwen3")], check=True,
                                     capture_output=True, text=True).stdout)
    entry = info["parts"]["model"]["model.layers.1.mlp.down_proj.weight"]
    assert entry["mf"] == "layers.1.feed_forward.w2.weight" and entry["file"] == "model.safetensors"
    assert info["parts"]["model"]["lm_head.weight"]["mf"] == "output.weight"


def test_shapes_are_checked_against_a_config_without_reading_data(trained):
    stored = mf_ckpt.stored_tensors(trained["ckpt"])
    config = dict(trained["config"])
    assert mf_ckpt.check_config_shapes(config, stored, "ck") is True
    with pytest.raises(mf_ckpt.CheckpointError) as info:
        mf_ckpt.check_config_shapes({**config, "hidden_size": 196608}, stored, "ck", "the hf_config in common.json")
    message = str(info.value)
    assert message.startswith("ck: tensor 'tok_embeddings.weight' has shape [600, 96], the hf_config in common.json "
                              "implies [600, 196608]") and "\n" not in message
    with pytest.raises(mf_ckpt.CheckpointError, match="ck: config.json has num_hidden_layers 100000, the checkpoint "
                                                      "holds 2 layers"):
        mf_ckpt.check_config_shapes({**config, "num_hidden_layers": 100000}, stored, "ck")
    # the rename plan itself refuses sizes no model has (mf -> hf of a crafted hf_config)
    with pytest.raises(mf_ckpt.CheckpointError, match="num_hidden_layers 1000000000 with these sizes"):
        mf_ckpt.mf_to_hf({}, {**config, "num_hidden_layers": 10**9})
    assert mf_ckpt.check_config_shapes({"model_type": "bloom"}, stored, "ck") is False
