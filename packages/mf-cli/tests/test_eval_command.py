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


# ---- mf eval --tasks: lm-evaluation-harness in process (the checkpoint-directory form, against mf
# serve and a teacher-forced forward, is tests-integration/test_lm_eval.py) ---------------------
def _harness_setup(root, prefix) -> tuple[str, str]:
    """An eval YAML with a tokenizer (its eval_dataset unused by --tasks) and a 6-item task."""
    import mf_data

    corpus = root / "tok.jsonl"   # few characters: a vocabulary of 64 (the model's) covers them
    words = ["is", "even", "odd", "yes", "no", "one", "two", "three", "four", "five", "six"]
    lines = [" ".join(words[(i * 7 + k * 3) % len(words)] for k in range(8)) + f" {i}?" for i in range(300)]
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    mf_data.train_sentencepiece([str(corpus)], str(root / "tok.model"), 64)
    tasks = root / "tasks"
    tasks.mkdir(exist_ok=True)
    rows = [{"q": f"Is {i} even?", "choices": ["yes", "no"], "answer": i % 2} for i in range(6)]
    (tasks / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "mf_even.yaml").write_text(
        f"task: mf_even\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tasks / 'items.jsonl'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{q}}"\ndoc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{answer}}"\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n')
    return _yaml(root, prefix, "tasks.yaml", tokenizer={"path": str(root / "tok.model")}), str(tasks)


def test_tasks_run_lm_eval_in_process(setup, capsys, monkeypatch, tmp_path):
    root, prefix = setup
    config, tasks = _harness_setup(root, prefix)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    out = tmp_path / "results"
    assert main(["eval", config, "--tasks", "mf_even", "--include-path", tasks, "--limit", "4", "--batch-size", "3",
                 "--output-path", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    results = json.loads(captured.out.strip().splitlines()[-1])
    assert 0.0 <= results["mf_even"]["acc,none"] <= 1.0
    assert "mf eval: note: eval_dataset is not used: lm-eval tasks bring their own data" in captured.err
    (written,) = out.glob("*/results_*.json")   # as lm-eval writes them: <output>/<model>/results_<date>.json
    assert json.loads(written.read_text())["results"]["mf_even"]["acc,none"] == results["mf_even"]["acc,none"]
    assert json.loads(written.read_text())["n-samples"]["mf_even"]["effective"] == 4
    assert main(["eval", config, "--tasks", "mf_odd", "--include-path", tasks]) == 2
    assert "no lm-eval task named 'mf_odd'" in capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["--limit", "5"], "--limit applies to lm-eval tasks: add --tasks NAMES"),
    (["--include-path", "."], "--include-path applies to lm-eval tasks"),
    (["--tasks", "x", "--all"], "--all applies to the eval_dataset evaluation"),
    (["--tasks", "x", "--batch-size", "0"], "--batch-size: must be at least 1, got 0"),
    (["--tasks", "x", "--include-path", "/nonexistent"], "--include-path: /nonexistent is not a directory"),
])
def test_task_flags_are_checked_first(setup, capsys, args, needle):
    root, prefix = setup
    assert main(["eval", _yaml(root, prefix), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_tasks_without_lm_eval_is_one_line(setup, capsys, monkeypatch):
    root, prefix = setup
    monkeypatch.setitem(sys.modules, "lm_eval", None)   # as if the eval extra were not installed
    assert main(["eval", _yaml(root, prefix), "--tasks", "hellaswag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['mf eval: error: --tasks runs lm-evaluation-harness, which is not installed: '
                   'pip install "mf-cli[eval]"'], err
