"""Every YAML of examples/ run as a user runs it: the files copied as they are into a scratch
directory, the commands started there (`mf train examples/tiny/train.yaml`, ...), with only their
sizes turned down by `--set` (fewer steps, a smaller demo model, PyNative after the demo so no
graph is compiled twice). One demo run feeds the rest: its checkpoint is the base of the LoRA and
full fine-tunes, the weights of eval / predict, and its data and tokenizer are reused.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The demo's model, smaller: every YAML that restates it (eval, predict) gets the same keys.
SMALL = ["--set", "model.hidden_size=64", "--set", "model.intermediate_size=128", "--set", "model.num_hidden_layers=2",
         "--set", "model.num_attention_heads=2", "--set", "model.num_key_value_heads=1"]
PYNATIVE = ["--set", "context.mode=1"]


def mf(cwd, *args, timeout=900):
    exe = shutil.which("mf", path=os.path.dirname(sys.executable))
    command = [exe] if exe else [sys.executable, "-m", "mf_cli.main"]
    return subprocess.run([*command, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "GLOG_v": "3"}, timeout=timeout)


def ok(done):
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """examples/ in a scratch directory, and the demo trained there: 4 steps, evaluated at 2 and 4."""
    work = tmp_path_factory.mktemp("examples")
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("cache"))
    done = ok(mf(work, "train", "examples/tiny/train.yaml", "--set", "training.steps=4",
                 "--set", "eval_dataset.eval_interval=2", "--set", "inference.max_new_tokens=4", *SMALL))
    return work, done.stdout


def test_demo_trains_evaluates_and_explains_its_run_directory(demo):
    work, stdout = demo
    out = work / "output" / "tiny"
    lines = stdout.splitlines()
    # the first lines say where everything goes
    first = [x for x in lines if x.startswith("[mf_trainer] ")][:6]
    assert first[:5] == ["[mf_trainer] output_dir: output/tiny (the resolved config.yaml; summary.json at the end)",
                         "[mf_trainer] metrics: output/tiny/metrics.jsonl",
                         "[mf_trainer] tensorboard: output/tiny/tensorboard",
                         "[mf_trainer] log: output/tiny/train.log",
                         "[mf_trainer] checkpoints: output/tiny/checkpoint (every 100 steps and at the end, 2 kept)"]
    assert first[5] == "[mf_trainer] a new run"
    assert "demo corpus: trained a 2000-piece sentencepiece model" in stdout
    assert "[mf_data] train_dataset: " in stdout and "[mf_data] eval_dataset (valid split): " in stdout
    # the held-out split is evaluated during training: the eval curve has two points
    evals = [r for r in records(out / "metrics.jsonl") if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2, 4] and all(r["eval_batches"] == 2 for r in evals)
    assert "eval at step 2: loss" in stdout
    # samples, readably: a header, then the prompt and the completion on labelled lines
    for i, prompt in enumerate(("The for statement", "A class definition"), start=1):
        at = lines.index(f"[mf_trainer] sample {i}/2")
        assert lines[at + 1] == f"  prompt     | {prompt}" and lines[at + 2].startswith("  completion | ")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["step"] == 4 and summary["sessions"] == 1
    assert summary["last_checkpoint"]["path"].endswith("iteration_00000004")
    # train.log holds the console's lines (every monitor.log_interval steps, the first and the last)
    assert (out / "config.yaml").is_file()
    assert (out / "train.log").read_text().count(" [mf_trainer] step ") == stdout.count("[mf_trainer] step ") >= 2
    # the same YAML again: this run is finished (exit 2, nothing touched); its config.yaml is the same run
    for config in ("examples/tiny/train.yaml", "output/tiny/config.yaml"):
        again = mf(work, "train", config, "--set", "training.steps=4", "--set", "eval_dataset.eval_interval=2",
                   *SMALL)   # the steps and interval it ran with
        assert again.returncode == 2 and "this run already finished at step 4" in again.stderr, again.stderr
    assert json.loads((out / "summary.json").read_text()) == summary
    # mf report reads the run directory: wall time from the records, checkpoints from their records
    report = ok(mf(work, "report", "output/tiny", "--out", "demo.png"))
    assert report.stdout.startswith("tiny (") and "steps 1-4 (4 recorded, 0 skipped); wall time " in report.stdout
    # checkpoint records hold absolute paths, so the report finds them from any directory
    assert re.search(r"last checkpoint: step 4, /\S*/output/tiny/checkpoint/iteration_00000004 \(on disk",
                     report.stdout), report.stdout
    assert (work / "demo.png").stat().st_size > 10_000


def test_mf_eval_of_the_training_yaml_uses_the_runs_weights(demo):
    work, _ = demo
    done = ok(mf(work, "eval", "examples/tiny/train.yaml", "--json", *SMALL, *PYNATIVE))
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["weights"] == "output/tiny/checkpoint" and got["data"] == "eval_dataset (valid split)"
    assert "weights: output/tiny/checkpoint (the run's trained weights: checkpoint.save_path, iteration 4)" in done.stderr
    # the same weights on the same batches as the evaluation logged during training at step 4
    last = [r for r in records(work / "output" / "tiny" / "metrics.jsonl") if "eval_loss" in r][-1]
    assert got["loss"] == pytest.approx(last["eval_loss"], rel=1e-5) and got["tokens"] == last["eval_tokens"]
    # eval.yaml: the same checkpoint and split, named explicitly
    again = ok(mf(work, "eval", "examples/tiny/eval.yaml", "--json", *SMALL, *PYNATIVE))
    assert json.loads(again.stdout.strip().splitlines()[-1])["loss"] == pytest.approx(got["loss"], rel=1e-5)


def test_predict_yaml_generates(demo):
    work, _ = demo
    done = ok(mf(work, "generate", "examples/tiny/predict.yaml", "--max-new-tokens", "4", *SMALL, *PYNATIVE))
    assert done.stdout.startswith("The for statement")          # the prompts in order, each completed
    assert all(prompt in done.stdout for prompt in ("A class definition", "Exceptions"))
    assert "mf generate: 3 prompt(s)" in done.stderr


def test_lora_example_fine_tunes_the_demo_and_eval_generate_use_its_adapters(demo):
    work, _ = demo
    done = ok(mf(work, "train", "examples/tiny/lora.yaml", "--set", "training.steps=3",
                   "--set", "eval_dataset.eval_interval=3", *PYNATIVE))
    out = done.stdout
    assert "model: taken from output/tiny/checkpoint (hf_config) (llama: num_hidden_layers 2, hidden_size 64" in out
    assert re.search(r"demo SFT data: \d+ conversations from pydoc_data.topics", out) and "LoRA: rank 8" in out
    assert "trainable (" in next(x for x in out.splitlines() if "parameters: " in x)
    evals = [r for r in records(work / "output" / "tiny_lora" / "metrics.jsonl") if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3]
    # mf eval on the fine-tune YAML: the fine-tuned adapters (merged into their base), not the base
    got = ok(mf(work, "eval", "examples/tiny/lora.yaml", "--json", *PYNATIVE))
    result = json.loads(got.stdout.strip().splitlines()[-1])
    assert result["weights"] == "output/tiny_lora/checkpoint"
    assert "the run's fine-tuned weights: checkpoint.save_path, iteration 3" in got.stderr
    assert result["loss"] == pytest.approx(evals[-1]["eval_loss"], rel=1e-5)
    base = ok(mf(work, "eval", "examples/tiny/lora.yaml", "--json", "--weights", "output/tiny/checkpoint", *PYNATIVE))
    assert json.loads(base.stdout.strip().splitlines()[-1])["loss"] != result["loss"]
    generated = ok(mf(work, "generate", "examples/tiny/lora.yaml", "--prompt", "What does the assert statement do?",
                      "--max-new-tokens", "3", *PYNATIVE))
    assert "mf generate: note: weights: output/tiny_lora/checkpoint (the run's fine-tuned weights" in generated.stderr


def test_full_finetune_from_an_hf_directory_takes_its_model(demo):
    work, _ = demo
    ok(mf(work, "ckpt", "convert", "--from", "mf", "--to", "hf", "output/tiny/checkpoint", "output/tiny/hf"))
    done = ok(mf(work, "train", "examples/tiny/finetune_hf.yaml", "--set", "training.steps=2", *PYNATIVE))
    assert "model: taken from output/tiny/hf/config.json (llama: num_hidden_layers 2, hidden_size 64" in done.stdout
    assert "[mf_trainer] finetune: weights of " in done.stdout
    config = (work / "output" / "tiny_ft" / "config.yaml").read_text()
    assert "hidden_size: 64" in config          # the run directory records the model it trained


@pytest.mark.parametrize("name", ["qwen3", "deepseek_v3"])
def test_tiny_presets_of_the_other_architectures_train(demo, name):
    work, _ = demo
    # the preset as written, with fewer and smaller batches (PyNative MoE dispatch is slow on CPU)
    done = ok(mf(work, "train", f"examples/tiny/{name}.yaml", "--set", "training.steps=2",
                   "--set", "training.local_batch_size=4", "--set", "training.global_batch_size=4",
                   "--set", "eval_dataset.eval_interval=2", "--set", "eval_dataset.eval_iters=1", *PYNATIVE))
    assert "demo corpus: using the cached" in done.stdout and "mf train: done at step 2" in done.stdout
    losses = [r["loss"] for r in records(work / "output" / f"tiny_{name}" / "metrics.jsonl") if "loss" in r]
    assert len(losses) == 2 and all(3.0 < x < 12.0 for x in losses)   # about ln(2000) = 7.6 untrained


@pytest.mark.parametrize("name, world", [("llama3_8b", 16), ("qwen3_8b", 16), ("deepseek_v3", 256)])
def test_full_size_presets_pass_the_dry_run(tmp_path, name, world, capsys, monkeypatch):
    from mf_cli.main import main

    monkeypatch.chdir(tmp_path)          # their outputs are relative: the dry run must write none
    path = ROOT / "examples" / "presets" / f"{name}.yaml"
    assert main(["train", str(path), "--dry-run", "--world", str(world)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"layout: world={world} " in out and "start: a new run" in out and "nothing was written" in out
    assert list(tmp_path.iterdir()) == []
