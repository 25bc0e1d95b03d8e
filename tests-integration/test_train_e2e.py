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


def records(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def losses(out: Path) -> list[float]:
    rows = [r for r in records(out) if "loss" in r]
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return [r["loss"] for r in rows]


def tensorboard_scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of a scalar as TensorBoard itself reads the run (its EventAccumulator, which
    applies the purge a resumed writer records)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_a_killed_run_rerun_with_the_same_yaml_resumes_without_repeating_steps(tmp_path, corpus):
    full = tmp_path / "full"
    done = mf("train", write_yaml(tmp_path / "full.yaml", corpus, full))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mf train: done at step 6" in done.stdout
    assert (full / "checkpoint" / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    reference = losses(full)
    assert len(reference) == 6 and reference[-1] < reference[0]

    # The same run, SIGKILLed at the end of step 5 (after checkpoint 4 was started asynchronously),
    # then the very same command again: it resumes from the last committed checkpoint by itself.
    part = tmp_path / "part"
    config = write_yaml(tmp_path / "part.yaml", corpus, part,
                        callbacks=[{"type": "kill_hooks:KillAtStep", "step": 5, "once": str(tmp_path / "killed")}])
    killed = mf("train", config)
    assert killed.returncode == -signal.SIGKILL
    committed = int((part / "checkpoint" / "latest_checkpointed_iteration.txt").read_text())
    assert committed in (2, 4)
    assert [r["step"] for r in records(part) if "loss" in r] == [1, 2, 3, 4, 5]     # step 5 beyond the checkpoint
    rerun = mf("train", config)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert (f"resuming this run from its checkpoint at step {committed} "
            f"({part / 'checkpoint' / f'iteration_{committed:08d}'})") in rerun.stdout
    assert losses(part) == reference  # bit for bit, one record per step: JSON keeps every float exactly
    # TensorBoard continues the same history: steps 1-6 once each (the killed session's step 5 purged)
    scalars = tensorboard_scalars(part / "tensorboard", "train/loss")
    assert [step for step, _ in scalars] == [1, 2, 3, 4, 5, 6]
    assert [value for _, value in scalars] == pytest.approx(reference, rel=1e-6)   # float32 in the events
    summary = json.loads((part / "summary.json").read_text())
    assert (summary["status"], summary["step"], summary["start_step"], summary["sessions"]) == \
        ("finished", 6, committed, 2)
    assert (part / "train.log").read_text().count("==== mf train session: ") == 2
    # and once more: finished, nothing to do, nothing touched
    again = mf("train", config)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert "training.steps: 6: this run already finished at step 6" in again.stderr
    assert losses(part) == reference


def test_bad_yaml_exits_2_with_one_line_and_writes_nothing(tmp_path, corpus):
    path = tmp_path / "bad.yaml"
    write_yaml(path, corpus, tmp_path / "out")
    path.write_text(path.read_text().replace("global_batch_size: 4", "global_batch_size: [4"))
    out = mf("train", str(path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "out").exists()
    out = mf("train", write_yaml(tmp_path / "b2.yaml", corpus, tmp_path / "out", optimizer={"type": "SGD"}))
    assert out.returncode == 2 and out.stderr == (
        "mf train: error: optimizer.type: unknown optimizer 'SGD'; available: AdamW, Muon\n")
    assert not (tmp_path / "out").exists()
