"""A checkpoint written by `mf train` generates through `mf generate` without its YAML (the model
from common.json's hf_config, the tokenizer from the recorded training config), identically to
the same weights loaded by hand; and after `mf ckpt convert --to hf`, the Hugging Face directory
generates the same text."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mf_data
import mf_models
from mf_models.inference import load_pretrained

TRAIN = """\
output_dir: out
context: {mode: 1}
checkpoint: {save_interleaved_steps: 2, save_max: 1}
training: {steps: 2, local_batch_size: 2, global_batch_size: 2, seed: 3}
optimizer: {type: AdamW}
lr_scheduler: {type: CosineWithWarmUpLR, learning_rate: 1.e-3, warmup_steps: 1, lr_end: 1.e-4}
train_dataset:
  dataloader:
    type: BlendedMegatronDatasetDataLoader
    datasets_type: GPTDataset
    sizes: [8, 0, 0]
    column_names: [input_ids, labels, loss_mask, position_ids]
    config: {seq_length: 32, split: "1,0,0", seed: 1, eod: 2, pad: 0, create_attention_mask: False,
             data_path: ["1", "cache/pydoc_text_document"]}
    demo_corpus: {vocab_size: 300}
  num_parallel_workers: 1
tokenizer: {path: cache/pydoc_spm.model}
model: {model_type: llama, vocab_size: 300, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2,
        num_attention_heads: 2, max_position_embeddings: 64, seq_length: 32}
"""
PROMPTS = ["The for statement", "Classes"]


def mf(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mf_cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "GLOG_v": "3"}, timeout=600)


def test_trained_checkpoint_generates_without_its_yaml(tmp_path):
    (tmp_path / "train.yaml").write_text(TRAIN)
    trained = mf(tmp_path, "train", "train.yaml")
    assert trained.returncode == 0, trained.stderr[-2000:]
    args = ["--prompt", PROMPTS[0], "--prompt", PROMPTS[1], "--max-new-tokens", "8", "--mode", "pynative"]
    done = mf(tmp_path, "generate", "out/checkpoint", *args, "--output", "gen.jsonl")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tokens/s" in done.stderr
    rows = [json.loads(line) for line in (tmp_path / "gen.jsonl").read_text().splitlines()]

    tok = mf_data.SentencePieceTokenizer(str(tmp_path / "cache" / "pydoc_spm.model"))
    model = load_pretrained(tmp_path / "out" / "checkpoint").model
    for prompt, row in zip(PROMPTS, rows):
        ids = tok.encode([prompt])[0]
        out = mf_models.generate(model, ids, 8, eos_token_id=[], use_cache=False)[len(ids):].tolist()
        out = out[:out.index(tok.eod)] if tok.eod in out else out
        assert row["prompt_ids"] == ids and row["completion_ids"] == out
        assert row["completion"] == tok.decode(ids + out)[len(tok.decode(ids)):]

    converted = mf(tmp_path, "ckpt", "convert", "--from", "mf", "--to", "hf", "out/checkpoint", "hf")
    assert converted.returncode == 0, converted.stderr[-2000:]
    again = mf(tmp_path, "generate", "hf", *args, "--tokenizer", "cache/pydoc_spm.model", "--output", "hf.jsonl")
    assert again.returncode == 0, again.stderr[-2000:]
    assert [json.loads(line) for line in (tmp_path / "hf.jsonl").read_text().splitlines()] == rows
