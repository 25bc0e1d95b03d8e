"""`mf generate CONFIG --dry-run`: the checks of `mf generate` before any model is built, nothing written."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from mf_cli.main import main

PREDICT = {
    "run_mode": "predict",
    "model": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 256},
    "checkpoint": {"load_path": "/models/none"},
    "tokenizer": {"path": "/models/none/tokenizer.model", "type": "sentencepiece"},
    "inference": {"max_new_tokens": 8},
}


def _write(tmp_path, data, name="predict.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_dry_run_passes_without_prompts_and_loads_nothing(tmp_path, capsys):
    path = _write(tmp_path, PREDICT)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["generate", path, "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "mf generate: dry run: prompts: none yet: give --prompt TEXT, --input FILE or inference.prompts" in out
    assert "mf generate: dry run: weights: /models/none" in out
    assert any(x.startswith("mf generate: dry run: model: llama") for x in out)
    assert out[-1].endswith("passes the preflight of mf generate; nothing was loaded or written")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_dry_run_imports_no_mindspore(tmp_path):
    import subprocess

    path = _write(tmp_path, PREDICT)
    code = (f"import sys; from mf_cli.main import main; rc = main(['generate', {path!r}, '--dry-run']); "
            "print('mindspore' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "False", done.stderr


def test_dry_run_with_prompts_and_flags(tmp_path, capsys):
    path = _write(tmp_path, PREDICT)
    assert main(["generate", path, "--dry-run", "--prompt", "hello", "--prompt", "world", "--do-sample",
                 "--top-k", "5"]) == 0
    out = capsys.readouterr().out
    assert "prompts: 2 in the config" in out and "decoding: sampling (temperature 1.0, top_k 5, top_p 1.0)" in out


def test_dry_run_takes_a_training_yaml_as_mf_generate_does(tmp_path, capsys):
    """mf generate accepts a training YAML (its run's weights, or checkpoint.load_path): so does
    its dry run, naming the weights."""
    data = json.loads(json.dumps(PREDICT))
    data.update({"run_mode": "train", "train_dataset": {"dataloader": {"type": "BlendedMegatronDatasetDataLoader"}},
                 "training": {"steps": 1}})
    assert main(["generate", _write(tmp_path, data), "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "weights: /models/none" in out + err, out + err


@pytest.mark.parametrize("change, message", [
    ({"checkpoint": {}}, "mf generate: error: checkpoint.load_path: run_mode predict needs the weights to generate with"),
    ({"model": {"model_type": "nosuch"}}, "mf generate: error: model"),
    ({"inference": {"max_new_tokens": 0}}, "mf generate: error: inference.max_new_tokens"),
    ({"inference": {"input_file": "/nope/prompts.jsonl"}}, "mf generate: error: inference.input_file: /nope/prompts.jsonl: "
                                                           "no such file"),
])
def test_dry_run_refusals_are_keyed_lines(tmp_path, capsys, change, message):
    data = json.loads(json.dumps(PREDICT))
    data.update(change)
    assert main(["generate", _write(tmp_path, data), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(message) and "Traceback" not in err


def test_dry_run_needs_a_config(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--dry-run"]) == 2
    assert "--dry-run checks a predict YAML" in capsys.readouterr().err
