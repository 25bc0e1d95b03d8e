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


def test_there_are_eight_files():
    assert len(FILES) == 8


@pytest.mark.parametrize("name", FILES)
def test_validates_and_round_trips(name, tmp_path):
    result = _migrate(name)
    cfg = result.validate()
    out = tmp_path / "train.yaml"
    out.write_text(result.to_yaml(), encoding="utf-8")
    # a predict file holds no prompts (`mf generate --prompt` gives them): checked as `mf serve` checks it
    assert load_config(out, overrides=result.prompt_placeholder()) == cfg
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
    assert _lines(result, "model.model_config.mtp_depth")[0].kind == "translated"     # MTP is trained
    assert extra["num_nextn_predict_layers"] == 1 and extra["mtp_loss_scaling_factor"] == 0.3
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


# -- issue 18: real models' figures --------------------------------------------------------------
def test_llama2_70b_width_is_mindformers_and_float16_parameters_become_float32():
    result = _migrate("pretrain_llama2_70b_fp16.yaml")
    cfg = result.validate()
    # MindFormers' LlamaFeedForward: int((1.3 + 0.01) * 4 * 8192) = 42926, int(2 * 42926 / 3) = 28617, -> 28672
    # (the released Llama-2-70B width); Meta's order (2/3 first, no 0.01) would give 28416.
    assert cfg.model.extra["intermediate_size"] == 28672
    assert "MindFormers' LlamaFeedForward" in _lines(result, "model.model_config.ffn_dim_multiplier")[0].message
    assert cfg.model.extra["params_dtype"] == "float32"
    fp16 = _lines(result, "model.model_config.param_init_type")[0]
    assert fp16.kind == "action" and fp16.fix == "model.params_dtype" and "non-finite" in fp16.message
    assert result.world_size == 32  # data 4 x tensor 8
    mindrecord = _lines(result, "train_dataset.data_loader.type")[0]
    assert mindrecord.message.startswith("MindRecord data ('/data/wiki4096/wiki4096.mindrecord') (MindDataset)")
    assert "`mf data preprocess --input" in mindrecord.message
    assert mindrecord.fix == "train_dataset.dataloader.config.data_path"
    assert cfg.train_dataset.dataloader.column_names == ["input_ids", "labels", "loss_mask"]
    # generation settings of model_config are not carried into a training config
    assert cfg.inference.top_k == 0 and _lines(result, "model.model_config.top_k")[0].kind == "unneeded"
    # the action lines travel with the file
    assert "# action: model.model_config.param_init_type: action" in result.to_yaml()


def test_mindformers_width_order_against_the_published_widths():
    from mf_config.legacy.model_rules import llama_ffn_width

    assert llama_ffn_width(8192, 256, 1.3) == 28672   # Llama-2-70B (MindFormers' configs)
    assert llama_ffn_width(4096, 256) == 11008         # Llama-2-7B
    assert llama_ffn_width(5120, 256) == 13824         # Llama-2-13B
    assert llama_ffn_width(8192, 1024, 1.3) == 28672   # Llama-3-70B (multiple_of 1024)
    assert llama_ffn_width(4096, 1024, 1.3) == 14336   # Llama-3-8B


def test_mixtral_keeps_its_experts():
    result = _migrate("pretrain_mixtral_8x7b.yaml")
    cfg = result.validate()
    m = cfg.model
    assert (m.model_type, m.architectures) == ("mixtral", "MixtralForCausalLM")
    assert (m.extra["num_local_experts"], m.extra["num_experts_per_tok"]) == (8, 2)
    assert (m.extra["router_aux_loss_coef"], m.extra["output_router_logits"]) == (0.05, True)
    assert cfg.parallelism.expert_parallel == 8
    assert _lines(result, "moe_config.capacity_factor")[0].kind == "dropped"  # dropless now
    assert all(line.kind != "dropped" or "dense" not in line.message for line in result.report)
    assert cfg.train_dataset.dataloader.column_names == ["input_ids", "labels", "loss_mask", "position_ids",
                                                         "attention_mask"]


def test_qwen2_predict_config_keeps_its_bias_and_generation_settings():
    result = _migrate("predict_qwen2_7b_instruct.yaml")
    cfg = result.validate()
    assert cfg.run_mode == "predict"
    assert (cfg.model.model_type, cfg.model.architectures) == ("qwen2", "Qwen2ForCausalLM")
    assert _lines(result, "model.model_config.qkv_has_bias")[0].message == "mf's qwen2 always has q/k/v biases"
    inf = cfg.inference
    assert (inf.do_sample, inf.temperature, inf.top_k, inf.top_p) == (True, 0.7, 20, 0.8)
    assert inf.prompts == ["-"]  # validated with the placeholder `mf serve` uses; the file holds none
    assert "prompts" not in result.new.get("inference", {})
    assert cfg.checkpoint.load_path == "/models/Qwen2-7B-Instruct"
    assert (cfg.tokenizer.path, cfg.tokenizer.type) == ("/models/Qwen2-7B-Instruct", "hf")
    assert cfg.model.extra["params_dtype"] == "bfloat16"
    assert "train_dataset" not in result.new and "parallelism" not in result.new
    assert _lines(result, "runner_config")[0].kind == "unneeded"
    assert result.lines("action") == [] and result.world_size == 1


def test_deepseek_v3_keeps_experts_and_trains_its_mtp_layer():
    result = _migrate("finetune_deepseek3_671b_mtp.yaml")
    cfg = result.validate()
    m = cfg.model.extra
    assert cfg.model.model_type == "deepseek_v3"
    assert (m["n_routed_experts"], m["n_shared_experts"], m["num_experts_per_tok"]) == (256, 1, 8)
    assert (m["first_k_dense_replace"], m["routed_scaling_factor"], m["n_group"], m["topk_group"]) == (3, 2.5, 8, 4)
    assert m["num_nextn_predict_layers"] == 1
    mtp = _lines(result, "model.model_config.mtp_depth")[0]
    assert mtp.kind == "translated" and "trained, with their loss, on the last pipeline stage" in mtp.message
    assert m["mtp_loss_scaling_factor"] == 0.3          # MindFormers' mtp_loss_factor
    assert result.world_size == 16 * 4 * 16


def test_finetune_without_weights_and_predict_without_weights_are_actions():
    import yaml as _yaml

    raw = _yaml.safe_load((DATA / "finetune_deepseek3_671b_mtp.yaml").read_text(encoding="utf-8"))
    raw["load_checkpoint"] = ""
    result = migrate_legacy(raw)
    assert [(line.key, line.fix) for line in result.lines("action")] == [("load_checkpoint", "checkpoint.load_path")]
    gone = result.apply_overrides(["checkpoint.load_path=/models/ds"])
    assert [line.key for line in gone] == ["load_checkpoint"] and result.lines("action") == []
    assert result.validate().checkpoint.load_path == "/models/ds"
    raw = _yaml.safe_load((DATA / "predict_qwen2_7b_instruct.yaml").read_text(encoding="utf-8"))
    raw["load_checkpoint"] = ""
    result = migrate_legacy(raw)
    assert [line.fix for line in result.lines("action")] == ["checkpoint.load_path"]
