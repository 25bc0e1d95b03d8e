"""`migrate_legacy` on four realistic older-format files (tests/data/legacy, written in the style of
MindFormers' configs/llama2, research/qwen2_5, research/deepseek3 and configs/qwen3 YAMLs).

Each result must validate, account for every key of the old file (reported, or copied to the same
place), and carry the values a user would check first.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mf_config import dump_config, load_config, migrate_legacy, pipeline_layer_placement
from mf_config.legacy.source import LegacySource, show_path

DATA = Path(__file__).resolve().parent / "data" / "legacy"
FILES = sorted(p.name for p in DATA.glob("*.yaml"))


def _migrate(name: str):
    return migrate_legacy(DATA / name)


def _lines(result, key: str) -> list:
    return [line for line in result.report if line.key == key]


def test_there_are_four_files():
    assert len(FILES) == 4


@pytest.mark.parametrize("name", FILES)
def test_validates_and_round_trips(name, tmp_path):
    result = _migrate(name)
    cfg = result.validate()
    out = tmp_path / "train.yaml"
    out.write_text(result.to_yaml(), encoding="utf-8")
    assert load_config(out) == cfg
    assert load_config(yaml.safe_load(dump_config(cfg))) == cfg


@pytest.mark.parametrize("name", FILES)
def test_every_old_key_is_accounted_for(name):
    """Every leaf of the old file is reported (itself or a parent), or copied to the same path."""
    result = _migrate(name)
    raw = yaml.safe_load((DATA / name).read_text(encoding="utf-8"))
    reported = {line.key for line in result.report}
    missing = []
    for path in LegacySource(raw).leaves():
        shown = [show_path(path[:i]) for i in range(1, len(path) + 1)]
        if any(s in reported for s in shown):
            continue
        node = result.new
        for key in path:
            node = node.get(key, KeyError) if isinstance(node, dict) else KeyError
        if node != LegacySource(raw).get(path):
            missing.append(show_path(path))
    assert missing == []


@pytest.mark.parametrize("name", FILES)
def test_realistic_files_use_no_unknown_keys(name):
    """The rule tables know every key of these files: nothing falls through to the final sweep."""
    result = _migrate(name)
    assert [str(line) for line in result.report if "knows how to carry over" in line.message] == []


def test_llama2_13b_pretrain():
    result = _migrate("run_llama2_13b_pretrain.yaml")
    cfg = result.validate()
    model = cfg.model
    assert (model.model_type, model.architectures) == ("llama", "LlamaForCausalLM")
    # Llama 2 13B's published intermediate_size, derived from hidden_size and multiple_of.
    assert model.extra["intermediate_size"] == 13824
    assert model.extra["num_hidden_layers"] == 40 and model.extra["num_attention_heads"] == 40
    # float16 parameters train without loss scaling into NaN: float32 is written, with an action.
    assert model.extra["params_dtype"] == "float32" and "num_layers" not in model.extra
    p = cfg.parallelism
    assert (p.tensor_parallel, p.pipeline_parallel, p.data_parallel_shard, p.sequence_parallel) == (2, 2, -1, True)
    assert (cfg.training.local_batch_size, cfg.training.global_batch_size) == (2, 64)  # 2 x dp 4 x micro 8
    assert cfg.training.seed == 1234 and cfg.training.max_norm == 1.0
    assert (cfg.recompute.mode, cfg.recompute.full_recompute_layer) == ("full", ["0-39"])
    assert cfg.optimizer.betas == [0.9, 0.95] and cfg.optimizer.weight_decay == 0.0  # MindFormers' default
    assert cfg.lr_scheduler.type == "CosineWithWarmUpLR" and cfg.lr_scheduler.learning_rate == 3e-4
    assert cfg.lr_scheduler.extra == {"lr_end": 3e-5, "warmup_ratio": 0.01}  # total_steps -1 left to mf
    ck = cfg.checkpoint
    assert (ck.enable_save, ck.prefix, ck.save_interleaved_steps, ck.save_max, ck.async_save) == (
        True, "llama2_13b", 500, 3, True)
    assert cfg.monitor.log_interval == 10
    assert (cfg.tokenizer.path, cfg.tokenizer.type) == ("/data/llama2/tokenizer.model", "sentencepiece")
    assert cfg.train_dataset.dataloader.type == "BlendedMegatronDatasetDataLoader"
    assert cfg.train_dataset.num_parallel_workers == 4 and cfg.train_dataset.prefetch_size == 2
    assert cfg.eval_dataset is None and cfg.context.device_target == "Ascend"
    actions = {line.key for line in result.lines("action")}
    assert actions == {"train_dataset.data_loader.type", "runner_config.epochs", "model.model_config.param_init_type"}
    assert str(_lines(result, "runner_config.sink_mode")[0]).startswith(
        "runner_config.sink_mode: dropped — data sinking has no equivalent in the new trainer")
    assert _lines(result, "runner_wrapper.scale_sense")[0].kind == "dropped"
    assert _lines(result, "callbacks[2]")[0].message.startswith("ObsMonitor: ")


def test_qwen2_5_lora_finetune():
    result = _migrate("finetune_qwen2_5_7b_lora.yaml")
    cfg = result.validate()
    assert cfg.run_mode == "finetune"
    assert (cfg.lora.lora_rank, cfg.lora.lora_alpha, cfg.lora.lora_dropout) == (8, 16.0, 0.05)
    assert cfg.lora.target_modules == ".*wq|.*wk|.*wv|.*wo"
    assert (cfg.checkpoint.load_path, cfg.checkpoint.no_load_optim) == ("/ckpt/qwen2_5_7b_ms", True)
    assert cfg.model.extra["num_key_value_heads"] == 4 and cfg.model.extra["rope_theta"] == 1e6
    assert cfg.model.extra["max_position_embeddings"] == 32768
    # MindFormers ran Qwen2.5 through its llama classes; q/k/v biases make it mf's qwen2.
    assert (cfg.model.model_type, cfg.model.architectures) == ("qwen2", "Qwen2ForCausalLM")
    assert _lines(result, "model.model_config.qkv_has_bias")[0].kind == "unneeded"
    # recompute [4, 2] on two stages of 14 layers: the first 4 of stage 0, the first 2 of stage 1.
    assert cfg.recompute.full_recompute_layer == ["0-3", "14-15"]
    assert _lines(result, "recompute_config.select_recompute")[0].kind == "dropped"
    assert cfg.parallelism.data_parallel_shard_strategy == "no_shard"
    assert cfg.parallelism.sequence_parallel is False
    assert _lines(result, "parallel_config.use_seq_parallel")[0].kind == "dropped"
    assert (cfg.training.global_batch_size, cfg.training.max_norm) == (8, 0.5)
    assert cfg.lr_scheduler.extra == {"lr_end": 1e-6, "warmup_ratio": 0.05}
    assert _lines(result, "lr_schedule.warmup_steps")[0].kind == "unneeded"
    assert cfg.eval_dataset.eval_interval == 200
    # the converted data gets the causal mask of the model (create_attention_mask off), so no mask column
    assert cfg.eval_dataset.dataloader.column_names == ["input_ids", "labels", "loss_mask"]
    assert cfg.tokenizer.path == ""  # an HF tokenizer is for `mf data preprocess-sft`, not the training YAML
    # generation settings of model_config are not written to a training config (nothing generates with them)
    assert cfg.inference.top_k == 0 and _lines(result, "model.model_config.top_p")[0].kind == "unneeded"


def test_deepseek3_moe_pretrain():
    result = _migrate("pretrain_deepseek3_small_moe.yaml")
    cfg = result.validate()
    extra = cfg.model.extra
    assert (cfg.model.model_type, extra["n_routed_experts"], extra["num_experts_per_tok"]) == ("deepseek_v3", 16, 4)
    assert (extra["n_shared_experts"], extra["first_k_dense_replace"], extra["moe_intermediate_size"]) == (1, 1, 1024)
    assert (extra["n_group"], extra["topk_group"]) == (1, 1)  # MindFormers routes without groups by default
    p = cfg.parallelism
    assert (p.expert_parallel, p.data_parallel_shard) == (4, 4)  # optimizer_weight_shard_size -> HSDP
    # offset [1, -1] over 9 layers + 1 MTP layer: 6 and 4, the MTP layer leaves the last stage.
    assert p.pipeline_parallel_layers_per_stage == [6, 3]
    placement = pipeline_layer_placement(p.pipeline_parallel_layers_per_stage, 2, 1, 9)
    assert placement == [[0, 1, 2, 3, 4, 5], [6, 7, 8]]
    assert cfg.recompute.full_recompute_layer == ["0-1", "6"]  # first 2 of stage 0, first 1 of stage 1
    assert cfg.training.steps == 1000  # 1 epoch x 64000 samples // global batch 64
    assert (cfg.profiler.enable_profiling, cfg.profiler.start_step, cfg.profiler.end_step) == (True, 3, 5)
    assert cfg.profiler.profiler_rank == [0, 16]
    assert cfg.train_dataset.dataloader.extra["config"]["random_seed"] == 1234
    assert _lines(result, "callbacks[1]")[0].kind == "dropped"
    assert _lines(result, "model.model_config.mtp_depth")[0].kind == "dropped"
    assert _lines(result, "moe_config.use_gating_sigmoid")[0].kind == "unneeded"


def test_qwen3_mcore_with_swap():
    result = _migrate("pretrain_qwen3_mcore_swap.yaml")
    cfg = result.validate()
    assert (cfg.model.model_type, cfg.model.architectures) == ("qwen3", "Qwen3ForCausalLM")
    assert cfg.model.extra["hidden_act"] == "silu" and cfg.model.extra["tie_word_embeddings"] is True
    assert (cfg.checkpoint.load_path, cfg.checkpoint.no_load_optim) == ("/ckpt/qwen3_run1", False)
    assert cfg.checkpoint.save_path == "/ckpt/qwen3_run2"
    assert cfg.training.deterministic is True and cfg.training.max_consecutive_nonfinite == 1
    assert (cfg.training.global_batch_size, cfg.training.steps) == (16, 2500)
    # with swap on, MindFormers reads recompute lists as layer indices
    assert cfg.recompute.full_recompute_layer == ["0-3"]
    assert cfg.swap.enable is True and cfg.swap.default_prefetch == 2
    assert [s.layers for s in cfg.swap.layer_swap] == [["6-7"]]
    assert [(s.op_name, s.layers) for s in cfg.swap.op_swap] == [("attention", ["8-11"])]
    assert (cfg.monitor.train_state.local_loss, cfg.monitor.train_state.device_norm) == (True, True)
    assert cfg.train_dataset.dataloader.extra["config"]["seed"] == 1234
    # an HF tokenizer is for preprocessing; the end-of-training sample takes sentencepiece only
    assert cfg.tokenizer.path == "" and "preprocess-sft" in _lines(result, "pretrained_model_dir")[0].message
    assert result.lines("action") == []


def test_the_old_mapping_is_not_modified():
    raw = yaml.safe_load((DATA / "pretrain_deepseek3_small_moe.yaml").read_text(encoding="utf-8"))
    before = yaml.safe_dump(raw)
    migrate_legacy(raw)
    assert yaml.safe_dump(raw) == before
