"""Malformed configs: each error is one line that starts with the exact key path of the problem.

Every case is a small YAML fragment; the sections it does not define come from the minimal
config (conftest.MINIMAL_SECTIONS: an 8-layer, 8-head model), so each case fails for exactly
the reason it shows.
"""

from __future__ import annotations

import pytest

from mf_config import ConfigError

CASES = [
    # (fragment, key path the message must start with, text the message must contain)
    ("training:\n  global_batch_size: 0", "training.global_batch_size", "must be positive, got 0"),
    ("training:\n  local_batch_size: -1", "training.local_batch_size", "must be positive, got -1"),
    ("training:\n  stpes: 10", "training.stpes", "unknown key; did you mean 'steps'?"),
    ("traning:\n  steps: 10", "traning", "unknown top-level section; did you mean 'training'?"),
    ("training:\n  steps: '20'", "training.steps", "expected an integer, got '20' (str)"),
    ("training:\n  steps: true", "training.steps", "expected an integer, got True (bool)"),
    ("training:\n  steps: 10.0", "training.steps", "expected an integer, got 10.0 (float)"),
    ("training:\n  steps: 1e3", "training.steps", "expected an integer, got 1000.0 (float)"),
    ("training:\n  max_norm: 0", "training.max_norm", "must be positive"),
    ("training:\n  max_norm: abc", "training.max_norm", "expected a number, got 'abc'"),
    ("training:\n  max_norm: .inf", "training.max_norm", "must be a finite number"),
    ("training:\n  seed: -1", "training.seed", "must be in [0, 2**32 - 1]"),
    ("training:\n  deterministic: 'yes'", "training.deterministic", "expected a boolean"),
    ("training:\n  max_consecutive_nonfinite: 0", "training.max_consecutive_nonfinite", "must be positive"),
    ("training:\n  local_batch_size: 4\n  global_batch_size: 2", "training.global_batch_size", "got 2"),
    ("training: 5", "training", "expected a mapping"),
    ("checkpoint:\n  save_max: 0", "checkpoint.save_max", "must be positive"),
    ("checkpoint:\n  prefix: a/b", "checkpoint.prefix", "without path separators"),
    ("checkpoint:\n  enable_save: 1", "checkpoint.enable_save", "expected a boolean"),
    ("checkpoint:\n  load_worker_number: 0", "checkpoint.load_worker_number", "must be positive"),
    ("checkpoint:\n  save_interleaved_steps: -5", "checkpoint.save_interleaved_steps", "must be positive"),
    ("checkpoint: [1, 2]", "checkpoint", "expected a mapping"),
    ("checkpoint:\n  save_pth: x", "checkpoint.save_pth", "did you mean 'save_path'?"),
    ("parallelism:\n  reshard_after_forward_policy: sometimes", "parallelism.reshard_after_forward_policy",
     "must be one of 'always', 'never', 'default'"),
    ("parallelism:\n  tensor_parallel: 0", "parallelism.tensor_parallel", "must be positive"),
    ("parallelism:\n  data_parallel_shard: -2", "parallelism.data_parallel_shard", "-1"),
    ("parallelism:\n  moe_token_dispatcher_type: alltoall_deredundancy\n  expert_parallel: 4",
     "parallelism.expert_parallel", "npu_nums_per_device (8)"),
    ("parallelism:\n  moe_token_dispatcher_type: all2all", "parallelism.moe_token_dispatcher_type", "alltoall"),
    ("parallelism:\n  context_parallel: 4\n  context_parallel_method: hybrid", "parallelism.ulysses_degree_in_cp",
     "required"),
    ("parallelism:\n  pipeline_parallel: 2\n  pipeline_parallel_layers_per_stage: [3, 4]",
     "parallelism.pipeline_parallel_layers_per_stage", "sum to 7"),
    ("parallelism:\n  tensor_parallel: 3", "parallelism.tensor_parallel", "num_attention_heads (8)"),
    ("parallelism:\n  expert_parallel: 4\nmodel:\n  model_type: x\n  n_routed_experts: 6",
     "parallelism.expert_parallel", "number of experts (6)"),
    ("optimizer:\n  betas: [0.9, 1.5]", "optimizer.betas[1]", "must be in [0.0, 1.0)"),
    ("optimizer:\n  eps: -1e-8", "optimizer.eps", "must be positive"),
    ("optimizer:\n  type: 5", "optimizer.type", "expected a string"),
    ("optimizer:\n  weight_decay_exclude: bias", "optimizer.weight_decay_exclude", "null or a list of strings"),
    ("optimizer:\n  weight_decay: -0.1", "optimizer.weight_decay", "must be >= 0"),
    ("lr_scheduler:\n  learning_rate: fast", "lr_scheduler.learning_rate", "expected a number"),
    ("train_dataset:\n  dataloader:\n    type: X\n    shuffle: 'no'", "train_dataset.dataloader.shuffle",
     "expected a boolean"),
    ("train_dataset:\n  dataloader:\n    type: X\n  num_parallel_workers: 0", "train_dataset.num_parallel_workers",
     "must be positive"),
    ("train_dataset:\n  dataloader:\n    type: BlendedMegatronDatasetDataLoader\n    config:\n      seq_length: 0",
     "train_dataset.dataloader.config.seq_length", "positive integer"),
    ("train_dataset:\n  dataloader:\n    type: BlendedMegatronDatasetDataLoader\n    config:\n"
     "      data_path: ['1', a, b, c]", "train_dataset.dataloader.config.data_path[2]", "expected a weight"),
    ("train_dataset:\n  dataloader:\n    type: X\n  dataloaders: {}", "train_dataset.dataloaders",
     "did you mean 'dataloader'?"),
    ("train_dataset:\n  dataloader:\n    type: X\n    column_names: []", "train_dataset.dataloader.column_names",
     "must not be empty"),
    ("train_dataset:\n  drop_remainder: true", "train_dataset.dataloader.type", "is required"),
    ("model:\n  model_type: x\n  num_hidden_layers: '12'", "model.num_hidden_layers", "positive integer"),
    ("model:\n  model_type: x\n  hidden_size: 0", "model.hidden_size", "positive integer"),
    ("model:\n  hidden_size: 64", "model.model_type", "needs a model_type"),
    ("monitor:\n  moe_monitor:\n    target_layers: [0, 8]", "monitor.moe_monitor.target_layers[1]", "out of range"),
    ("monitor:\n  train_state:\n    local_los: true", "monitor.train_state.local_los", "did you mean 'local_loss'?"),
    ("monitor:\n  log_interval: 0", "monitor.log_interval", "must be positive"),
    ("monitor:\n  moe_monitor:\n    save_tokens_per_expert_interval: 0",
     "monitor.moe_monitor.save_tokens_per_expert_interval", "must be positive"),
    ("profiler:\n  start_step: 5\n  end_step: 3", "profiler.end_step", "must be >= profiler.start_step (5)"),
    ("profiler:\n  start_step: 0", "profiler.start_step", "must be positive"),
    ("profiler:\n  profiler_level: 3", "profiler.profiler_level", "must be in [0, 2]"),
    ("profiler:\n  profiler_rank: [0, 0]", "profiler.profiler_rank[1]", "duplicate"),
    ("recompute:\n  mode: full", "recompute.full_recompute_layer", "required"),
    ("recompute:\n  mode: select", "recompute.select_module", "required"),
    ("recompute:\n  mode: partial", "recompute.mode", "one of 'None', 'full', 'select'"),
    ("recompute:\n  mode: full\n  full_recompute_layer: ['4-7', '0-3']", "recompute.full_recompute_layer[1]",
     "sorted strictly ascending"),
    ("recompute:\n  mode: full\n  full_recompute_layer: ['0-8']", "recompute.full_recompute_layer[0]",
     "out of range"),
    ("recompute:\n  mode: full\n  full_recompute_layer: [0, 1]", "recompute.full_recompute_layer[0]",
     "quoted string"),
    ("recompute:\n  mode: select\n  select_module:\n    attention: ['0-1', '1']",
     "recompute.select_module.attention[1]", "must not overlap"),
    ("recompute_comm:\n  enable: true", "recompute_comm.select_module", "required"),
    ("recompute_comm:\n  enable: true\n  select_module:\n    'attention.qkv': ['9']",
     "recompute_comm.select_module['attention.qkv'][0]", "out of range"),
    ("swap:\n  enable: true\n  default_prefetch: 8\n  layer_swap:\n    - layers: ['0']", "swap.default_prefetch",
     "[1, 7]"),
    ("swap:\n  layer_swap:\n    - layers: ['3-1']", "swap.layer_swap[0].layers[0]", "below its start"),
    ("swap:\n  layer_swap:\n    - layer: ['0']", "swap.layer_swap[0].layer", "did you mean 'layers'?"),
    ("swap:\n  op_swap:\n    - layers: ['0']", "swap.op_swap[0].op_name", "required"),
    ("swap:\n  enable: true", "swap.enable", "layer_swap or swap.op_swap"),
    ("swap:\n  layer_swap:\n    - layers: ['0-1']\n    - layers: ['1']", "swap.layer_swap[1].layers",
     "already offloaded"),
    ("swap:\n  layer_swap: {layers: ['0']}", "swap.layer_swap", "null or a list of mappings"),
    ("callbacks:\n  - log_interval: 10", "callbacks[0].type", "required"),
    ("callbacks:\n  type: X", "callbacks", "expected a list"),
    ("callbacks:\n  - type: A\n  - type: ''", "callbacks[1].type", "must not be empty"),
    ("context:\n  device_target: cpu", "context.device_target", "did you mean 'CPU'?"),
    ("context:\n  mode: 2", "context.mode", "'pynative'"),
    ("context:\n  mode: eager", "context.mode", "'graph'"),
    ("context:\n  device_id: -1", "context.device_id", "must be >= 0"),
    ("run_mode: training", "run_mode", "one of 'train', 'finetune', 'eval', 'predict'"),
    ("output_dir: ''", "output_dir", "must not be empty"),
    ("eval_dataset:\n  dataloader:\n    type: X\n  eval_iters: 0", "eval_dataset.eval_iters", "must be positive"),
    ("eval_dataset:\n  dataloader:\n    shuffle: false", "eval_dataset.dataloader.type", "is required"),
    ("lora:\n  lora_rank: 8", "lora.target_modules", "required"),
    ("lora:\n  target_modules: '('", "lora.target_modules", "not a valid regular expression"),
    ("lora:\n  target_modules: q\n  lora_dropout: 1.0", "lora.lora_dropout", "must be in [0.0, 1.0)"),
    ("lora:\n  target_modules: q\n  exclude_layers: ['7-9']", "lora.exclude_layers[0]", "out of range"),
    ("inference:\n  top_p: 0", "inference.top_p", "must be in (0.0, 1.0]"),
    ("inference:\n  temperature: 0", "inference.temperature", "must be positive"),
    ("inference:\n  top_k: -1", "inference.top_k", "must be >= 0"),
    ("inference:\n  stop_token_ids: [1, 1000]", "inference.stop_token_ids[1]", "model.vocab_size (1000)"),
    ("tokenizer:\n  type: bpe", "tokenizer.type", "one of 'sentencepiece', 'hf'"),
    ("model:\n  model_type: x\n  extra_thing: !!set {a}", "model.extra_thing", "not plain YAML data"),
]


@pytest.mark.parametrize(("fragment", "key_path", "text"), CASES, ids=[c[1] + "|" + c[2][:30] for c in CASES])
def test_error_names_the_key_path_on_one_line(load_text, fragment, key_path, text):
    with pytest.raises(ConfigError) as info:
        load_text(fragment)
    message = str(info.value)
    assert message.startswith(key_path + ":"), message
    assert text in message, message
    assert "\n" not in message
    assert info.value.key_path == key_path


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40
