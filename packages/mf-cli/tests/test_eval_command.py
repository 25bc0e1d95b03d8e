"""`mf eval` through the real entry point (`main(argv)`, and a subprocess for the exit codes), and
`mf train` pointing eval / predict configs at the command that runs them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

import mf_ckpt
import mf_models
from mf_cli.main import main

MODEL = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32}


def _mf(*args):
    env = {**os.environ, "GLOG_v": "3"}
    return subprocess.run([sys.executable, "-m", "mf_cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=600)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import mf_data

    root = tmp_path_factory.mktemp("eval")
    prefix = str(root / "toy_text_document")
    rng = np.random.RandomState(1)
    builder = mf_data.IndexedDatasetBuilder(mf_data.get_bin_path(prefix), dtype=np.uint16)
    for _ in range(30):
        start, length = rng.randint(0, 60), rng.randint(30, 80)
        builder.add_item(np.append((start + np.arange(length) * 3) % 61 + 2, 1).astype(np.uint16))
        builder.end_document()
    builder.finalize(mf_data.get_idx_path(prefix))
    state = mf_models.model_state(mf_models.build_model(MODEL, seed=2))
    mf_ckpt.save(str(root / "ckpt"), 7, state, None, common={"hf_config": MODEL})
    return root, prefix


def _yaml(root, prefix, name="eval.yaml", **changes) -> str:
    loader = {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [7, 0, 0],
              "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
              "config": {"seq_length": 16, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                         "data_path": ["1", prefix]}}
    cfg = {"run_mode": "eval", "output_dir": str(root / "out"), "context": {"mode": 1},
           "checkpoint": {"load_path": str(root / "ckpt")}, "training": {"local_batch_size": 2, "global_batch_size": 2},
           "eval_dataset": {"dataloader": loader, "eval_iters": 2, "num_parallel_workers": 1}, "model": MODEL}
    cfg.update(changes)
    path = root / name
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_mf_eval_prints_the_numbers(setup, capsys):
    root, prefix = setup
    config = _yaml(root, prefix)
    assert main(["eval", config, "--json"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["batches"] == 2 and first["samples"] == 4 and first["data"] == "eval_dataset (train split)"
    assert first["ppl"] == pytest.approx(math.exp(first["loss"])) and 0.0 <= first["accuracy"] <= 1.0
    assert 3.5 < first["loss"] < 4.8  # an untrained model: about ln(64) = 4.16
    assert main(["eval", config, "--all"]) == 0  # the whole split: 7 samples, 3 full batches (drop_remainder)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("mf eval: loss ") and "(3 batches, 6 samples) of eval_dataset (train split)" in line


@pytest.mark.parametrize("command, change, needle", [
    ("eval", {"run_mode": "predict", "inference": {"prompts": ["x"]}, "tokenizer": {"path": "t.model"}},
     "mf eval: error: run_mode: 'predict' generates text: run it with `mf generate CONFIG`"),
    ("eval", {"checkpoint": {"load_path": ""}}, "mf eval: error: checkpoint.load_path: evaluation needs weights"),
    ("eval", {"checkpoint": {"load_path": "/nonexistent"}}, "mf eval: error: checkpoint.load_path: /nonexistent"),
    ("eval", {"lora": {"target_modules": ".*"}}, "mf eval: error: lora: run_mode eval evaluates the weights"),
    ("train", {}, "mf train: error: run_mode: 'eval' is not a training mode: run `mf eval "),
    ("train", {"run_mode": "predict", "inference": {"prompts": ["x"]}, "tokenizer": {"path": "t.model"}},
     "is not a training mode: run `mf generate "),
])
def test_bad_input_is_one_line_and_exit_2(setup, capsys, command, change, needle):
    root, prefix = setup
    config = _yaml(root, prefix, "bad.yaml", **change)
    assert main([command, config]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_missing_config_through_the_installed_command(setup, tmp_path):
    out = _mf("eval", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("mf eval: error:") and len(out.stderr.strip().splitlines()) == 1
