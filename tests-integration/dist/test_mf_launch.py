"""`mf launch` as a user runs it: the installed command in a subprocess, msrun underneath.

A rank killed mid-run ends the whole job promptly with a clear message and a non-zero exit, and a
rank refusing its input is reported once. (The README's demo launches - TP, CP, PP, EP: rank 0
streamed to the console, per-rank logs, one metrics file, a sharded checkpoint, rank 0's sample -
are test_readme_commands.py's, run as written.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml
from _launches import toy_train_dataset

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROMPT_SECONDS = 150      # msrun start-up ~20 s here; a hung job would run into the test's timeout


def mf(*args, cwd=ROOT, timeout=900):
    exe = shutil.which("mf", path=os.path.dirname(sys.executable))
    command = [exe] if exe else [sys.executable, "-m", "mf_cli.main"]
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*command, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def test_killed_rank_ends_the_job(scratch, trainer_workdir):
    cfg = {
        "output_dir": str(scratch / "killed"),
        "context": {"mode": 1},
        "checkpoint": {"enable_save": False},
        "training": {"steps": 40, "local_batch_size": 2, "global_batch_size": 4},
        "lr_scheduler": {"learning_rate": 1e-3},
        "callbacks": [{"type": "_dist_hooks:KillRankAtStep", "rank": 1, "step": 2}],
        "train_dataset": toy_train_dataset(trainer_workdir),
        "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
        "monitor": {"peak_flops_per_device": 1e11, "tensorboard": False},
    }
    path = scratch / "killed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    start = time.monotonic()
    proc = mf("launch", "-n", "2", str(path), timeout=600)
    seconds = time.monotonic() - start
    text = proc.stdout
    assert proc.returncode != 0
    assert "mf launch: rank 1 failed: process" in text and "died without reporting an error" in text, text[-3000:]
    assert "step 1/40" in text                  # rank 0 was streamed while the job ran
    assert "mf launch: stopped all ranks" in text and "step 40/40" not in text
    assert seconds < PROMPT_SECONDS, f"took {seconds:.0f}s"


def test_a_rank_that_refuses_its_input_is_reported_once_with_exit_2(scratch, trainer_workdir):
    # Missing data files pass the preflight (it reads the config only) and are refused by every
    # rank when it opens the data: one line names the rank and its own error, exit 2.
    cfg = {
        "output_dir": str(scratch / "refused"),
        "training": {"steps": 2, "local_batch_size": 2, "global_batch_size": 4},
        "train_dataset": toy_train_dataset(trainer_workdir),
        "model": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 32},
        "monitor": {"peak_flops_per_device": 1e11, "tensorboard": False},
    }
    cfg["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", str(scratch / "no_such_text_document")]
    path = scratch / "refused.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = mf("launch", "-n", "2", str(path), timeout=600)
    text = proc.stdout
    assert proc.returncode == 2, text[-3000:] + proc.stderr[-2000:]
    failed = [line for line in text.splitlines() if " failed" in line and line.startswith("mf launch: ")]
    assert len(failed) == 1, text[-3000:]
    assert failed[0].startswith("mf launch: rank ") and " failed (exit 2): mf train: error: train_dataset" in failed[0]
    assert text.count("needs no_such_text_document.bin") == 1, text[-3000:]      # the reason, printed once
    assert "last lines of" not in text and "cluster scheduler" not in text
