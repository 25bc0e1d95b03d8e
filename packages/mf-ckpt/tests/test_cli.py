"""The `mf-ckpt` command, run through its installed console script (and `main(argv)` in-process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from mf_ckpt import SaveOptions, Saver, load, load_hf_state, run_threaded, shard_array
from mf_ckpt.cli import main

SCRIPT = Path(sys.executable).with_name("mf-ckpt")


def run(*args: str) -> subprocess.CompletedProcess:
    assert SCRIPT.exists(), "the mf-ckpt console script is not installed"
    return subprocess.run([str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def hf_tensors(d: Path) -> dict[str, np.ndarray]:
    index = d / "model.safetensors.index.json"
    files = set(json.loads(index.read_text())["weight_map"].values()) if index.exists() else {"model.safetensors"}
    out = {}
    for f in files:
        out.update(load_file(str(d / f)))
    return out


def assert_one_line_error(proc_or_capture, *needles):
    err = proc_or_capture.stderr if hasattr(proc_or_capture, "stderr") else proc_or_capture.err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mf-ckpt: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_convert_hf_mf_hf_round_trip_through_the_console_script(hf_fixtures, tmp_path):
    src = hf_fixtures / "deepseek_v3"
    r = run("convert", "--from", "hf", "--to", "mf", "--arch", "deepseek_v3", src, tmp_path / "mf")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "mf" / "latest_checkpointed_iteration.txt").read_text() == "0\n"
    r = run("verify", tmp_path / "mf")
    assert r.returncode == 0 and r.stdout.startswith("OK: 48 tensors"), r.stderr
    r = run("inspect", "--json", tmp_path / "mf")
    info = json.loads(r.stdout)
    assert info["kind"] == "mf" and info["iteration"] == 0 and info["world_size"] == 1
    assert info["parts"]["model"]["layers.1.moe.experts.w1"] == {"dtype": "F32", "shape": [8, 32, 96], "chunks": 1,
                                                                "bytes": 8 * 32 * 96 * 4}
    assert info["common"]["hf_config"]["model_type"] == "deepseek_v3"
    # mf -> hf restores config.json from the checkpoint; tensors come back byte-identical.
    r = run("convert", "--from", "mf", "--to", "hf", tmp_path / "mf", tmp_path / "hf")
    assert r.returncode == 0, r.stderr
    ref, got = hf_tensors(src), hf_tensors(tmp_path / "hf")
    assert sorted(ref) == sorted(got) and all(ref[k].tobytes() == got[k].tobytes() for k in ref)
    assert json.loads((tmp_path / "hf" / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    assert (tmp_path / "hf" / "generation_config.json").exists()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mixtral", "qwen3_moe", "gpt2", "glm4", "qwen2_moe", "glm4_moe"])
def test_convert_round_trip_in_process_with_shards(hf_fixtures, tmp_path, capsys, arch):
    assert main(["convert", "--from", "hf", "--to", "mf", "--arch", arch, str(hf_fixtures / arch), str(tmp_path / "mf")]) == 0
    assert main(["convert", "--from", "mf", "--to", "hf", "--max-shard-size", "300KB", str(tmp_path / "mf"),
                 str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    ref, got = hf_tensors(hf_fixtures / arch), hf_tensors(tmp_path / "hf")
    assert sorted(ref) == sorted(got) and all(ref[k].tobytes() == got[k].tobytes() for k in ref)


@pytest.fixture
def sharded_ckpt(tmp_path) -> Path:
    w = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)

    def body(comm):
        saver = Saver(SaveOptions(save_path=str(tmp_path / "ck")), comm)
        st = {"w": shard_array(w, 0, comm.rank, 4), "b": np.ones(6, np.float32)}
        saver.save(12, st, {"exp_avg.w": shard_array(w * 2, 1, comm.rank, 4, padded=True)},
                   common={"step": 12, "consumed_samples": 96})

    run_threaded(4, body)
    return tmp_path / "ck"


def test_inspect_text(sharded_ckpt, capsys):
    assert main(["inspect", str(sharded_ckpt)]) == 0
    out = capsys.readouterr().out
    assert "iteration: 12" in out and "saved by: 4 rank(s)" in out and "consumed_samples=96, step=12" in out
    assert "[40, 6]" in out and "chunks=4" in out and "checkpoint-model-0000003-0000004.safetensors" in out
    # 6 optimizer columns padded over 4 ranks: 2 each, so rank 3 holds only padding and writes no file.
    assert "exp_avg.w" in out and "chunks=3" in out and "checkpoint-opt-0000003" not in out


def test_merge_with_index_is_a_load_source(sharded_ckpt, tmp_path):
    r = run("merge", "--max-shard-size", "600B", sharded_ckpt, tmp_path / "merged")
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "merged").iterdir())
    assert "model.safetensors.index.json" in names and "optimizer.safetensors" in names and "common.json" in names
    index = json.loads((tmp_path / "merged" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == {"w", "b"} and len(set(index["weight_map"].values())) == 2
    out = {"w": np.zeros((40, 6), np.float32), "b": np.zeros(6, np.float32)}
    opt = {"exp_avg.w": np.zeros((40, 6), np.float32)}
    result = load(str(tmp_path / "merged"), out, opt)
    assert result.kind == "safetensors" and result.common["step"] == 12
    np.testing.assert_array_equal(out["w"], np.arange(240, dtype=np.float32).reshape(40, 6))
    np.testing.assert_array_equal(opt["exp_avg.w"], 2 * out["w"])
    assert main(["merge", "--no-optim", str(sharded_ckpt), str(tmp_path / "m2")]) == 0
    assert sorted(p.name for p in (tmp_path / "m2").iterdir()) == ["common.json", "model.safetensors"]


def test_verify_broken_checkpoint_exits_2_with_one_line(sharded_ckpt):
    f = sharded_ckpt / "iteration_00000012" / "checkpoint-model-0000002-0000004.safetensors"
    f.write_bytes(f.read_bytes()[:-3])
    r = run("verify", sharded_ckpt)
    assert r.returncode == 2 and r.stdout == ""
    assert_one_line_error(r, "checkpoint-model-0000002-0000004.safetensors", "truncated")


def test_destination_is_protected(hf_fixtures, tmp_path, capsys):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep.txt").write_text("precious")
    args = ["convert", "--from", "hf", "--to", "mf", "--arch", "llama", str(hf_fixtures / "llama"), str(dst)]
    assert main(args) == 2
    assert_one_line_error(capsys.readouterr(), "not empty", "--force")
    # A failing conversion with --force leaves the old content intact and no temp directory.
    assert main(["convert", "--from", "hf", "--to", "mf", "--arch", "llama", "--force", str(tmp_path / "nowhere"), str(dst)]) == 2
    assert_one_line_error(capsys.readouterr(), "nowhere")
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst"]
    assert main([*args[:-2], "--force", *args[-2:]]) == 0
    assert (dst / "latest_checkpointed_iteration.txt").exists() and not (dst / "keep.txt").exists()


@pytest.mark.parametrize("argv,needles", [
    (["frobnicate"], ["invalid choice: 'frobnicate'"]),
    (["convert", "--from", "hf", "--to", "mf", "/nonexistent/SRC", "DST"], ["/nonexistent/SRC: checkpoint directory does not exist"]),
    (["convert", "--from", "hf", "--to", "hf", "SRC", "DST"], ["is not a conversion"]),
    (["merge", "--max-shard-size", "lots", "A", "B"], ["invalid size 'lots'"]),
    (["inspect", "/nonexistent/ckpt"], ["/nonexistent/ckpt: checkpoint directory does not exist"]),
])
def test_bad_arguments_are_one_line(capsys, argv, needles):
    assert main(argv) == 2
    assert_one_line_error(capsys.readouterr(), *needles)


def test_unknown_arch_and_mismatched_arch(hf_fixtures, tmp_path, capsys):
    assert main(["convert", "--from", "hf", "--to", "mf", "--arch", "bloom", str(hf_fixtures / "llama"), str(tmp_path / "o")]) == 2
    assert_one_line_error(capsys.readouterr(), "unsupported model_type 'bloom'")
    assert main(["convert", "--from", "hf", "--to", "mf", "--arch", "qwen3", str(hf_fixtures / "llama"), str(tmp_path / "o")]) == 2
    assert_one_line_error(capsys.readouterr(), "model_type 'llama', not --arch 'qwen3'")


def test_mf_to_hf_needs_a_config(sharded_ckpt, hf_fixtures, tmp_path, capsys):
    assert main(["convert", "--from", "mf", "--to", "hf", str(sharded_ckpt), str(tmp_path / "o")]) == 2
    assert_one_line_error(capsys.readouterr(), "no Hugging Face config.json carried", "--hf-config")
    # A config that does not describe the checkpoint: the names are checked before writing.
    assert main(["convert", "--from", "mf", "--to", "hf", "--hf-config", str(hf_fixtures / "llama"), str(sharded_ckpt),
                 str(tmp_path / "o")]) == 2
    assert_one_line_error(capsys.readouterr(), "missing tensor")
    assert not (tmp_path / "o").exists()


def test_fine_tuned_sharded_checkpoint_converts_to_hf(hf_fixtures, tmp_path):
    """Train-side save (4 ranks, split weights, hf_config carried in common) -> HF directory."""
    config, state = load_hf_state(hf_fixtures / "qwen3")

    def body(comm):
        st = {k: shard_array(v, 0, comm.rank, 4) if v.ndim == 2 else v for k, v in state.items()}
        Saver(SaveOptions(save_path=str(tmp_path / "ck")), comm).save(3, st, common={"hf_config": config})

    run_threaded(4, body)
    assert main(["convert", "--from", "mf", "--to", "hf", str(tmp_path / "ck"), str(tmp_path / "hf")]) == 0
    ref, got = hf_tensors(hf_fixtures / "qwen3"), hf_tensors(tmp_path / "hf")
    assert sorted(ref) == sorted(got) and all(ref[k].tobytes() == got[k].tobytes() for k in ref)
