"""`mf config migrate` then `mf train` on what it wrote (issue 18): an older MindFormers config with
float16 parameters and MindRecord data, migrated with `--set` answering its actions, trains with
finite losses in real processes (before, `params_dtype: float16` went NaN after one step, skipped
every step and exited 0)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the e2e helpers beside this file
from test_train_e2e import corpus, mf  # noqa: E402, F401  (corpus is a fixture)

OLD = """\
seed: 3
output_dir: '{out}'
run_mode: 'train'
load_checkpoint: ''
runner_config: {{epochs: 1, batch_size: 2, sink_mode: True, sink_size: 1}}
runner_wrapper: {{type: MFTrainOneStepCell, scale_sense: 1.0, use_clip_grad: True}}
optimizer: {{type: AdamW, betas: [0.9, 0.95], eps: 1.e-8, weight_decay: 0.0}}
lr_schedule: {{type: ConstantWarmUpLR, learning_rate: 3.e-3, warmup_steps: 1, total_steps: -1}}
train_dataset:
  data_loader: {{type: MindDataset, dataset_dir: /data/wiki.mindrecord, shuffle: False}}
  input_columns: ["input_ids"]
  num_parallel_workers: 2
use_parallel: False
parallel_config: {{data_parallel: 1, model_parallel: 1, pipeline_stage: 1}}
callbacks:
  - {{type: MFLossMonitor, per_print_times: 1}}
context: {{mode: 1, device_target: CPU, device_id: 0}}
model:
  model_config:
    type: LlamaConfig
    seq_length: 32
    hidden_size: 32
    num_layers: 1
    num_heads: 2
    vocab_size: 64
    multiple_of: 16
    compute_dtype: float32
    param_init_type: float16
    top_k: 3
  arch: {{type: LlamaForCausalLM}}
"""


def test_a_migrated_float16_mindrecord_config_trains(tmp_path, corpus):  # noqa: F811
    out = tmp_path / "run"
    old = tmp_path / "run_llama_tiny.yaml"
    old.write_text(OLD.format(out=out), encoding="utf-8")
    new = tmp_path / "train.yaml"
    done = mf("config", "migrate", str(old), "-o", str(new), "--summary")
    assert done.returncode == 0, done.stderr
    assert "model.model_config.param_init_type: action" in done.stderr
    assert "MindRecord data ('/data/wiki.mindrecord') (MindDataset)" in done.stderr
    assert "training.steps could not be derived" in done.stderr

    answered = tmp_path / "train_set.yaml"
    done = mf("config", "migrate", str(old), "-o", str(answered), "--summary",
              "--set", f"train_dataset.dataloader.config.data_path=[{corpus}]", "--set", "training.steps=4",
              "--set", "train_dataset.dataloader.sizes=[64, 0, 0]", "--set", "model.params_dtype=float32")
    assert done.returncode == 0, done.stderr
    assert "0 need action (3 answered by --set)" in done.stderr
    assert f"passes the preflight; run it with `mf train {answered}`" in done.stderr
    assert mf("train", str(answered), "--dry-run").returncode == 0

    run = mf("train", str(answered))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mf train: done at step 4" in run.stdout
    rows = [json.loads(x) for x in Path(out, "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]          # the training steps (not the start/checkpoint records)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in rows)
