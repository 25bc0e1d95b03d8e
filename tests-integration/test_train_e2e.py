"""`mf train` as a user runs it: the installed entry point in a subprocess, real files on disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def mf(*args, cwd=None):
    exe = shutil.which("mf", path=os.path.dirname(sys.executable))
    command = [exe] if exe else [sys.executable, "-m", "mf_cli.main"]
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import mf_data

    prefix = str(tmp_path_factory.mktemp("data") / "toy_text_document")
    rng = np.random.RandomState(0)
    builder = mf_data.IndexedDatasetBuilder(mf_data.get_bin_path(prefix), dtype=np.uint16)
    for _ in range(60):
        start, length = rng.randint(0, 60), rng.randint(40, 120)
        builder.add_item(np.append((start + np.arange(length) * 3) % 61 + 2, 1).astype(np.uint16))
        builder.end_document()
    builder.finalize(mf_data.get_idx_path(prefix))
    return prefix


def write_yaml(path: Path, corpus: str, out: Path, **changes) -> str:
    cfg = {
        "output_dir": str(out),
        "checkpoint": {"save_interleaved_steps": 2, "save_max": 2, "async_save": True},
        "training": {"steps": 6, "local_batch_size": 2, "global_batch_size": 4, "seed": 3},
        "lr_scheduler": {"type": "WarmUpStableDecayLR", "learning_rate": 3e-3, "warmup_steps": 2,
                         "decay_start_steps": 4, "lr_end": 1e-4},
        "train_dataset": {"dataloader": {
            "type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [200, 0, 0],
            "column_names": ["input_ids", "labels", "loss_mask", "position_ids"],
            "config": {"seq_length": 32, "split": "1,0,0", "eod": 1, "pad": 0, "create_attention_mask": False,
                       "data_path": ["1", corpus]}}, "num_parallel_workers": 2},
        "model": {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "head_dim": 16, "max_position_embeddings": 64},
        "monitor": {"log_interval": 4, "peak_flops_per_device": 1e11},
    }
    cfg.update(changes)
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def losses(out: Path) -> list[float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return [r["loss"] for r in rows]


def test_killed_and_resumed_run_matches_the_uninterrupted_one(tmp_path, corpus):
    full = tmp_path / "full"
    done = mf("train", write_yaml(tmp_path / "full.yaml", corpus, full))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mf train: done at step 6" in done.stdout
    assert (full / "checkpoint" / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    assert list((full / "tensorboard").glob("events.out.tfevents.*"))
    reference = losses(full)
    assert len(reference) == 6 and reference[-1] < reference[0]

    # The same run, SIGKILLed at the end of step 5 (after checkpoint 4 was started asynchronously).
    part = tmp_path / "part"
    killed = mf("train", write_yaml(tmp_path / "part.yaml", corpus, part,
                                    callbacks=[{"type": "kill_hooks:KillAtStep", "step": 5}]))
    assert killed.returncode == -signal.SIGKILL
    committed = int((part / "checkpoint" / "latest_checkpointed_iteration.txt").read_text())
    assert committed in (2, 4)
    resumed = mf("train", write_yaml(tmp_path / "resume.yaml", corpus, part,
                                     checkpoint={"save_interleaved_steps": 2, "save_max": 2, "async_save": True,
                                                 "load_path": str(part / "checkpoint")}))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resuming from {part / 'checkpoint'} at step {committed}" in resumed.stdout
    assert losses(part) == reference  # bit for bit: JSON keeps every float exactly


def test_bad_yaml_exits_2_with_one_line_and_writes_nothing(tmp_path, corpus):
    path = tmp_path / "bad.yaml"
    write_yaml(path, corpus, tmp_path / "out")
    path.write_text(path.read_text().replace("global_batch_size: 4", "global_batch_size: [4"))
    out = mf("train", str(path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()
    out = mf("train", write_yaml(tmp_path / "b2.yaml", corpus, tmp_path / "out", optimizer={"type": "SGD"}))
    assert out.returncode == 2 and out.stderr == (
        "mf train: error: optimizer.type: unknown optimizer 'SGD'; available: AdamW\n")
    assert not (tmp_path / "out").exists()


def test_demo_yaml_builds_its_corpus_trains_and_samples(tmp_path):
    cache = tmp_path / "cache"
    out = mf("train", str(ROOT / "examples" / "tiny" / "train.yaml"),
             "--set", f"output_dir={tmp_path / 'out'}", "--set", f"checkpoint.save_path={tmp_path / 'ckpt'}",
             "--set", f"train_dataset.dataloader.config.data_path=['1', '{cache}/pydoc_text_document']",
             "--set", f"tokenizer.path={cache}/pydoc_spm.model",
             "--set", "training.steps=2", "--set", "inference.max_new_tokens=4",
             # the demo's data, tokenizer and settings, on a smaller model to keep the suite fast
             "--set", "model.hidden_size=64", "--set", "model.intermediate_size=128",
             "--set", "model.num_hidden_layers=1", "--set", "model.num_attention_heads=2",
             "--set", "model.num_key_value_heads=1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo corpus: trained a 2000-piece sentencepiece model" in out.stdout
    assert (cache / "pydoc_text_document.bin").stat().st_size > 100_000
    assert out.stdout.count("[mf_trainer] sample: ") == 2
    assert (tmp_path / "ckpt" / "iteration_00000002").is_dir()
    # `mf report` on the demo's run directory: its summary and its PNG.
    report = mf("report", str(tmp_path / "out"), "--out", str(tmp_path / "demo.png"))
    assert report.returncode == 0, report.stdout + report.stderr
    assert report.stdout.startswith(f"out ({tmp_path / 'out'}): steps 1-2 (2 recorded, 0 skipped); ")
    assert (tmp_path / "demo.png").stat().st_size > 10_000
