"""`dump_config` writes every field; `load_config` of that text gives back an equal config."""

from __future__ import annotations

from pathlib import Path

import yaml

from mf_config import TrainConfig, config_to_dict, dump_config, load_config

SKELETON = Path(__file__).resolve().parents[3] / "examples" / "skeleton.yaml"

# Every section set, most fields away from their defaults, pass-through keys in every allow_extra
# section, and values that trip naive YAML round trips ('1e5' the string, 'None' the string,
# an exponent float, unicode, a dotted module key).
EVERYTHING = """
run_mode: finetune
output_dir: /runs/exp1
context: {device_target: Ascend, mode: pynative, device_id: 3}
checkpoint:
  enable_save: false
  save_max: 2
  save_interleaved_steps: 50
  no_save_optim: true
  async_save: true
  prefix: qwen3
  remove_redundancy: true
  load_path: /runs/exp0/checkpoint
  load_balanced: true
  no_load_optim: true
  load_worker_number: 4
  save_global_layout_cache: false
training: {steps: 200, local_batch_size: 2, global_batch_size: 16, max_norm: 0.5, seed: 7,
           deterministic: true, max_consecutive_nonfinite: 2}
parallelism:
  data_parallel_shard: 2
  data_parallel_shard_strategy: optim_grads
  reshard_after_forward_policy: never
  disable_gradient_division: false
  tensor_parallel: 2
  context_parallel: 4
  context_parallel_method: hybrid
  context_parallel_async: true
  ulysses_degree_in_cp: 2
  pipeline_parallel: 2
  pipeline_parallel_interleave_num: 2
  pipeline_parallel_layers_per_stage: ['0-1, 4-8', '2-3, 9']
  pipeline_parallel_overlap_p2p: true
  pipeline_parallel_overlap_b_f: true
  pipeline_parallel_enable_dxdw_split: true
  expert_parallel: 4
  npu_nums_per_device: 4
  moe_token_dispatcher_type: alltoall_deredundancy
optimizer: {type: Muon, betas: [0.8], eps: 1e-10, weight_decay: 0, weight_decay_include: [w1],
            weight_decay_exclude: [bias, norm], momentum: 0.95, ns_steps: 5}
lr_scheduler: {type: CosineWithWarmUpLR, learning_rate: '3e-4', warmup_ratio: 0.01, min_lr: 1e-6, note: '1e5'}
train_dataset:
  dataloader:
    type: BlendedMegatronDatasetDataLoader
    shuffle: true
    column_names: [input_ids, labels, loss_mask, position_ids, actual_seq_len]
    python_multiprocessing: true
    datasets_type: GPTDataset
    sizes: [3200, 0, 0]
    config: {seq_length: 512, split: '98,2,0', eod: 2, pad: 0, create_compressed_eod_mask: true,
             data_path: ['0.5', /data/a_text_document, '0.5', /data/b_text_document]}
  drop_remainder: false
  num_parallel_workers: 2
  prefetch_size: 3
  numa_enable: true
model:
  model_type: deepseek_v3
  architectures: DeepseekV3ForCausalLM
  num_hidden_layers: 10
  num_attention_heads: 8
  seq_length: 512
  vocab_size: 32000
  n_routed_experts: 8
  num_experts_per_tok: 2
  rms_norm_eps: 1e-6
  compute_dtype: bfloat16
  rope_scaling: {type: yarn, factor: 4.0}
  comment: 'None'
monitor:
  train_state: {local_norm: embedding, local_loss: true, device_norm: true, device_loss: true}
  moe_monitor: {save_tokens_per_expert_interval: 10, target_layers: [1, 3]}
  log_interval: 5
  tensorboard: false
  peak_flops_per_device: 2.8e14
profiler: {enable_profiling: true, start_step: 3, end_step: 5, output_path: /runs/prof, profiler_rank: [0, 1],
           profiler_level: 2, mstx: true, profile_memory: true, with_stack: false, profile_cpu: false}
recompute: {mode: select, select_module: {attention: ['0-1'], mlp: ['2', '5-9']}, full_recompute_layer: ['0']}
recompute_comm: {enable: true, select_module: {attention.qkv: ['0-3']}}
swap:
  enable: true
  default_prefetch: 3
  layer_swap: [{layers: ['0-1']}]
  op_swap: [{op_name: attention, layers: ['2']}, {op_name: mlp, layers: ['2-3']}]
callbacks:
  - {type: MyCustomCallback, log_interval: 10}
  - {type: Other}
eval_dataset:
  dataloader: {type: BlendedMegatronDatasetDataLoader, config: {seq_length: 512, data_path: [/data/val]}}
  eval_interval: 50
  eval_iters: 4
tokenizer: {path: /tok/tokenizer.model, type: sentencepiece}
lora: {target_modules: 'attention\\.w[qkvo]', exclude_layers: ['0'], lora_rank: 16, lora_alpha: 32,
       lora_dropout: 0.05}
inference: {max_new_tokens: 32, do_sample: true, temperature: 0.7, top_k: 50, top_p: 0.9,
            stop_token_ids: [2], batch_size: 4, prompts: ['你好', 'Hello'], output_file: /runs/gen.jsonl}
"""


def _round_trip(cfg: TrainConfig, tmp_path) -> TrainConfig:
    path = tmp_path / "shown.yaml"
    path.write_text(dump_config(cfg), encoding="utf-8")
    return load_config(path)


def test_skeleton_round_trips(tmp_path):
    cfg = load_config(SKELETON)
    again = _round_trip(cfg, tmp_path)
    assert again == cfg
    assert dump_config(again) == dump_config(cfg)


def test_a_config_with_every_section_set_round_trips(load_text, tmp_path):
    cfg = load_text(EVERYTHING)
    again = _round_trip(cfg, tmp_path)
    assert again == cfg
    assert dump_config(again) == dump_config(cfg)
    # spot checks that the values really are away from the defaults and typed
    assert cfg.context.mode == 1 and cfg.lr_scheduler.learning_rate == 3e-4
    assert cfg.lr_scheduler.extra["note"] == "1e5" and cfg.model.extra["comment"] == "None"
    assert cfg.model.extra["rms_norm_eps"] == 1e-6 and cfg.lora.lora_alpha == 32.0
    assert cfg.checkpoint.save_path == "/runs/exp1/checkpoint"
    assert all(value != default for value, default in zip(
        config_to_dict(cfg).values(), config_to_dict(TrainConfig()).values()))


def test_dump_is_plain_yaml_any_reader_accepts(load_text):
    data = yaml.safe_load(dump_config(load_text(EVERYTHING)))
    assert data["optimizer"]["betas"] == [0.8]
    assert data["recompute_comm"]["select_module"] == {"attention.qkv": ["0-3"]}
    assert data["inference"]["prompts"] == ["你好", "Hello"]


def test_dict_round_trip_without_yaml(load_text):
    cfg = load_text(EVERYTHING)
    assert load_config(config_to_dict(cfg)) == cfg


def test_dump_writes_scalar_lists_inline():
    text = dump_config(load_config(SKELETON))
    assert "  betas: [0.9, 0.95]\n" in text
    assert "callbacks: []\n" in text
