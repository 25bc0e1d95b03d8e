"""`migrate_legacy` rule by rule, on small old-format mappings built around a minimal base.

Where MindFormers documents the result of a rule (its pipeline-placement and recompute logs in
"流水并行的负载偏置与重计算" / memory_optimization.md, Meta's Llama 2 MLP widths), the expected
values are those documented numbers.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from mf_config import ConfigError, ReportLine, migrate_legacy

BASE = yaml.safe_load("""
runner_config: {epochs: 1, batch_size: 1}
model:
  model_config: {type: LlamaConfig, num_layers: 4, num_heads: 4, hidden_size: 64, seq_length: 128, vocab_size: 256}
  arch: {type: LlamaForCausalLM}
train_dataset:
  data_loader:
    type: BlendedMegatronDatasetDataLoader
    sizes: [64, 0, 0]
    config: {seq_length: 128, data_path: [/d/x_text_document]}
""")


def _merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in update.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def run(fragment: str = "", validate: bool = True):
    result = migrate_legacy(_merge(BASE, yaml.safe_load(fragment) or {}))
    cfg = result.validate() if validate else None
    return result, cfg


def line(result, key: str, kind: str | None = None) -> ReportLine:
    found = [x for x in result.report if x.key == key and kind in (None, x.kind)]
    assert len(found) == 1, (key, [str(x) for x in result.report])
    return found[0]


# -- the input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, message", [
    ({"training": {"steps": 1}, "model": {"model_type": "qwen3"}}, "already in the new format (it has training)"),
    ({"runner_config": {}, "training": {}}, "mixes the older format (runner_config) with sections of the new one"),
    ({"seed": 1, "output_dir": "x"}, "not an older MindFormers run_xxx.yaml: none of runner_config"),
])
def test_inputs_that_are_not_old_configs(raw, message):
    with pytest.raises(ConfigError) as exc:
        migrate_legacy(raw)
    assert str(exc.value).startswith(f"config: {message}")


def test_a_file_holding_a_list_is_refused(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"list.yaml: not an older MindFormers run_xxx.yaml: the top level must be "
                                          r"a mapping, got list$"):
        migrate_legacy(path)


def test_predict_configs_become_predict_yamls():
    result, cfg = run("run_mode: predict\nload_checkpoint: /ckpt/hf\n"
                      "processor: {tokenizer: {vocab_file: /tok/tokenizer.model}}\n"
                      "model: {model_config: {top_k: 3, do_sample: True, temperature: 0.7, batch_size: 4}}")
    assert cfg.run_mode == "predict" and cfg.checkpoint.load_path == "/ckpt/hf"
    inf = cfg.inference
    assert (inf.top_k, inf.do_sample, inf.temperature, inf.batch_size) == (3, True, 0.7, 4)
    assert "train_dataset" not in result.new and "training" not in result.new or not result.new["training"].get("steps")
    assert line(result, "train_dataset").kind == "unneeded" and line(result, "runner_config").kind == "unneeded"
    assert result.lines("action") == []


def test_file_errors_are_one_line(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope.yaml: no such file$"):
        migrate_legacy(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("runner_config:\n  epochs: [1,\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken.yaml: invalid YAML at line 3"):
        migrate_legacy(broken)


def test_an_unknown_key_is_reported_not_lost():
    result, _ = run("runner_config: {stop_after_minutes: 30}\nmy_plugin: {level: 3}")
    assert str(line(result, "runner_config.stop_after_minutes")) == (
        "runner_config.stop_after_minutes: dropped — not a key of the older format that mf knows how to carry over")
    assert line(result, "my_plugin.level").kind == "dropped"


def test_summary_and_grouping():
    result, _ = run("runner_config: {sink_mode: True}\nseed: 3")
    assert result.summary().endswith("need action") and result.counts()["dropped"] >= 1
    kinds = [x.kind for x in result.sorted_report()]
    assert kinds == sorted(kinds, key=["action", "dropped", "translated", "unneeded"].index)


# -- model ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("hidden, multiple_of, multiplier, expected", [
    (4096, 256, None, 11008),   # Llama 2 7B
    (5120, 256, None, 13824),   # Llama 2 13B
    (8192, 4096, 1.3, 28672),   # Llama 2 70B
])
def test_llama_mlp_width_is_derived_as_published(hidden, multiple_of, multiplier, expected):
    mc = {"hidden_size": hidden, "num_heads": 32, "multiple_of": multiple_of}
    if multiplier is not None:
        mc["ffn_dim_multiplier"] = multiplier
    _, cfg = run(yaml.safe_dump({"model": {"model_config": mc}}))
    assert cfg.model.extra["intermediate_size"] == expected


def test_renames_and_identity():
    result, cfg = run("model: {model_config: {n_kv_heads: 2, theta: 500000.0, max_position_embedding: 4096, "
                      "param_init_type: bfloat16}}")
    extra = cfg.model.extra
    assert (extra["num_hidden_layers"], extra["num_attention_heads"], extra["num_key_value_heads"]) == (4, 4, 2)
    assert (extra["rope_theta"], extra["max_position_embeddings"], extra["params_dtype"]) == (5e5, 4096, "bfloat16")
    assert str(line(result, "model.model_config.num_layers")) == (
        "model.model_config.num_layers: translated — model.num_hidden_layers: 4")
    assert line(result, "model.arch.type").message == "model.model_type: llama, model.architectures: LlamaForCausalLM"


def test_an_architecture_mf_lacks_is_refused_not_migrated_as_another():
    with pytest.raises(ConfigError, match=r"^model.arch.type: Baichuan2ForCausalLM: mf has no such model"):
        run("model: {arch: {type: Baichuan2ForCausalLM}, model_config: {type: Baichuan2Config}}")


def test_an_unknown_architecture_is_not_migrated_as_its_config_class_model():
    """GPT2ForSequenceClassification names GPT2Config, the config of mf's gpt2: still refused (a
    classification head is not the causal LM); so are Baichuan's classes over LlamaConfig."""
    with pytest.raises(ConfigError, match=r"^model.arch.type: GPT2ForSequenceClassification: mf has no such model"):
        run("model: {arch: {type: GPT2ForSequenceClassification}, model_config: {type: GPT2Config}}")
    with pytest.raises(ConfigError, match=r"^model.arch.type: Baichuan13BV2ForCausalLM: mf has no such model"):
        run("model: {arch: {type: Baichuan13BV2ForCausalLM}, model_config: {type: LlamaConfig}}")
    _, cfg = run("model: {arch: {type: ParallelLlamaForCausalLM}}")       # MindFormers' inference llama
    assert cfg.model.model_type == "llama"


GPT2 = """model:
  model_config: {type: GPT2Config, seq_length: 128, vocab_size: 256, hidden_size: 64, num_layers: 2, num_heads: 4,
                 expand_ratio: 4, hidden_act: gelu, hidden_dropout_rate: 0.1, attention_dropout_rate: 0.1,
                 post_layernorm_residual: False, use_prompt_flash_attention: False}
  arch: {type: GPT2LMHeadModel}
"""


def test_gpt2():
    result, cfg = run(GPT2)
    m = cfg.model.extra
    assert (cfg.model.model_type, cfg.model.architectures) == ("gpt2", "GPT2LMHeadModel")
    assert (m["n_inner"], m["n_positions"], m["activation_function"]) == (256, 128, "gelu_new")
    assert (m["num_hidden_layers"], m["num_attention_heads"]) == (2, 4)
    # mf trains without dropout: 0.0 written, the old non-zero rates reported as lost (the third, the
    # embedding's, from MindFormers' default)
    assert (m["resid_pdrop"], m["attn_pdrop"], m["embd_pdrop"]) == (0.0, 0.0, 0.0)
    assert line(result, "model.model_config.hidden_dropout_rate").kind == "dropped"
    assert any(x.kind == "dropped" and "embedding_dropout_prob" in x.message for x in result.report)
    assert "tanh approximation" in line(result, "model.model_config.hidden_act").message
    with pytest.raises(ConfigError, match=r"^model.model_config.post_layernorm_residual: True: the residual"):
        run(GPT2.replace("post_layernorm_residual: False", "post_layernorm_residual: True"))
    result, _ = run(GPT2.replace("hidden_act: gelu", "hidden_act: swiglu"))
    assert line(result, "model.model_config.hidden_act").fix == "model.activation_function"


GLM = """model:
  model_config: {type: ChatGLM2Config, num_layers: 2, padded_vocab_size: 151552, hidden_size: 64,
                 ffn_hidden_size: 96, kv_channels: 16, num_attention_heads: 4, seq_length: 128, rope_ratio: 1,
                 layernorm_epsilon: 1.5625e-07, rmsnorm: True, apply_residual_connection_post_layernorm: False,
                 post_layer_norm: True, add_bias_linear: False, add_qkv_bias: True, multi_query_attention: True,
                 multi_query_group_num: 2, apply_query_key_layer_scaling: True, quantization_bit: 0,
                 pre_seq_len: None, eos_token_id: [151329, 151336, 151338], pad_token_id: 151329}
  arch: {type: ChatGLM2ForConditionalGeneration}
"""


def run_glm(fragment: str):
    """`run` without the base's llama vocab_size (ChatGLM2 configs name theirs padded_vocab_size)."""
    raw = _merge(BASE, yaml.safe_load(fragment))
    del raw["model"]["model_config"]["vocab_size"]
    result = migrate_legacy(raw)
    return result, result.validate()


def test_chatglm2_configs_are_glm():
    """MindFormers' GLM-4-9B config (ChatGLM2 classes, GLM-4's vocabulary): transformers'
    GlmForCausalLM, the same network; Glm4ForCausalLM (GLM-4-0414) has two more norms per layer."""
    result, cfg = run_glm(GLM)
    m = cfg.model.extra
    assert (cfg.model.model_type, cfg.model.architectures) == ("glm", "GlmForCausalLM")
    assert (m["vocab_size"], m["intermediate_size"], m["head_dim"], m["num_key_value_heads"]) == (151552, 96, 16, 2)
    assert (m["attention_bias"], m["rope_theta"], m["rms_norm_eps"]) == (True, 10000.0, 1.5625e-07)
    assert any("GLM-4-9B" in x.message and "not Glm4ForCausalLM" in x.message for x in result.report)
    _, cfg = run_glm(GLM.replace("padded_vocab_size: 151552", "padded_vocab_size: 65024")
                     .replace("rope_ratio: 1", "rope_ratio: 50"))
    assert cfg.model.extra["rope_theta"] == 500000.0          # ChatGLM3-6B-32k: the same network, base x 50
    for switch, message in (("rmsnorm: True", "rmsnorm: False: mf's glm .* has RMSNorm"),
                            ("post_layer_norm: True", "post_layer_norm: False: mf's glm .* has a final norm"),
                            ("quantization_bit: 0", "quantization_bit: 4: mf's glm"),
                            ("pre_seq_len: None", "pre_seq_len: 128: mf's glm .* no P-tuning prefix")):
        bad = switch.replace("True", "False").replace(": 0", ": 4").replace("None", "128")
        with pytest.raises(ConfigError, match=f"^model.model_config.{message}"):
            run_glm(GLM.replace(switch, bad))
    _, cfg = run_glm(GLM.replace("multi_query_attention: True", "multi_query_attention: False"))
    assert cfg.model.extra["num_key_value_heads"] == 4


def test_a_llama_with_qkv_biases_and_gated_shared_experts_is_qwen2_moe():
    """Qwen2-57B-A14B as MindFormers wrote it: LlamaForCausalLM with q/k/v biases and a moe_config
    of 64 experts, 8 shared ones of the experts' width, their gate on."""
    moe = ("model: {model_config: {qkv_has_bias: True, intermediate_size: 32}}\n"
           "moe_config: {expert_num: 8, num_experts_chosen: 2, shared_expert_num: 4.0, use_shared_expert_gating: True,"
           " norm_topk_prob: False, aux_loss_factor: 0.001, capacity_factor: 1.1, routing_policy: TopkRouterV2}")
    result, cfg = run(moe)
    m = cfg.model.extra
    assert (cfg.model.model_type, cfg.model.architectures) == ("qwen2_moe", "Qwen2MoeForCausalLM")
    assert (m["num_experts"], m["num_experts_per_tok"], m["moe_intermediate_size"]) == (8, 2, 32)
    assert (m["shared_expert_intermediate_size"], m["qkv_bias"], m["norm_topk_prob"]) == (128, True, False)
    assert (m["output_router_logits"], m["router_aux_loss_coef"]) == (True, 0.001)
    assert line(result, "moe_config.capacity_factor").kind == "dropped"      # mf's MoE drops no token
    with pytest.raises(ConfigError, match=r"^moe_config.use_shared_expert_gating: False: a llama with q/k/v biases"):
        run(moe.replace("use_shared_expert_gating: True", "use_shared_expert_gating: False"))


def test_structure_switches():
    result, cfg = run("model: {model_config: {hidden_act: gelu, qkv_has_bias: False, extend_method: PI, "
                      "scaling_factor: 4.0, hidden_dropout: 0.1, unknown_knob: 1}}")
    assert line(result, "model.model_config.hidden_act").kind == "action"
    assert line(result, "model.model_config.qkv_has_bias").kind == "unneeded"
    assert cfg.model.extra["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}
    assert line(result, "model.model_config.hidden_dropout").kind == "dropped"
    assert line(result, "model.model_config.unknown_knob").message == "not a hyper-parameter of mf's llama model"


def test_moe_on_a_dense_model_and_a_dense_moe_config():
    result, cfg = run("moe_config: {expert_num: 8, num_experts_chosen: 2}")
    assert (cfg.model.model_type, cfg.model.extra["num_local_experts"]) == ("mixtral", 8)  # llama + experts
    with pytest.raises(ConfigError, match=r"^moe_config.shared_expert_num: 4: shared experts"):
        run("moe_config: {expert_num: 8, shared_expert_num: 4}")
    result, _ = run("moe_config: {expert_num: 1, capacity_factor: 1.1}")
    assert {line(result, "moe_config.expert_num").kind, line(result, "moe_config.capacity_factor").kind} == {"unneeded"}


def test_lora_and_other_peft():
    _, cfg = run("model: {model_config: {pet_config: {pet_type: lora, lora_rank: 4, lora_alpha: 8, "
                 "target_modules: '.*wq|.*wv'}}}\nrun_mode: finetune")
    assert (cfg.lora.lora_rank, cfg.lora.lora_alpha, cfg.lora.target_modules) == (4, 8.0, ".*wq|.*wv")
    result, cfg = run("model: {model_config: {pet_config: {pet_type: prefixtuning, prefix_token_num: 16}}}")
    assert cfg.lora is None and line(result, "model.model_config.pet_config.prefix_token_num").kind == "dropped"


# -- parallelism and placement -----------------------------------------------------------------------
def test_degrees_and_global_batch():
    result, cfg = run("parallel_config: {data_parallel: 2, model_parallel: 2, pipeline_stage: 2, micro_batch_num: 3}\n"
                      "runner_config: {batch_size: 2, gradient_accumulation_steps: 2}\nmicro_batch_interleave_num: 2")
    p = cfg.parallelism
    assert (p.tensor_parallel, p.pipeline_parallel, p.data_parallel_shard) == (2, 2, -1)
    assert (cfg.training.local_batch_size, cfg.training.global_batch_size) == (2, 48)  # 2 x 2 x 2 x 3 x 2
    assert "launch 8 devices" in line(result, "parallel_config.data_parallel").message


def test_use_parallel_false_ignores_parallel_config():
    result, cfg = run("use_parallel: False\nparallel_config: {data_parallel: 8, model_parallel: 2}\n"
                      "runner_config: {batch_size: 4, gradient_accumulation_steps: 2}")
    assert cfg.parallelism.tensor_parallel == 1 and cfg.training.global_batch_size == 8
    assert line(result, "parallel_config.model_parallel").kind == "unneeded"


def test_context_parallel_method():
    _, cfg = run("parallel_config: {context_parallel: 4, context_parallel_algo: hybrid_cp, ulysses_degree_in_cp: 2}")
    p = cfg.parallelism
    assert (p.context_parallel, p.context_parallel_method, p.ulysses_degree_in_cp) == (4, "hybrid", 2)


def test_shard_size_that_does_not_divide_is_dropped():
    result, cfg = run("parallel_config: {data_parallel: 6}\nparallel: {enable_parallel_optimizer: True, "
                      "parallel_optimizer_config: {optimizer_weight_shard_size: 4}}")
    assert cfg.parallelism.data_parallel_shard == -1
    assert line(result, "parallel.parallel_optimizer_config.optimizer_weight_shard_size").kind == "dropped"


def test_offset_places_layers_as_mindformers_documents():
    # MindFormers: 48 layers, pipeline_stage 5, offset [0, 1, 1, 1, 0] -> 9, 10, 10, 10, 9
    _, cfg = run("model: {model_config: {num_layers: 48, offset: [0, 1, 1, 1, 0]}}\n"
                 "parallel_config: {pipeline_stage: 5, micro_batch_num: 5}")
    assert cfg.parallelism.pipeline_parallel_layers_per_stage == [9, 10, 10, 10, 9]


INTERLEAVED = """
model: {model_config: {num_layers: 48, pp_interleave_num: 2, offset: [[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]}}
parallel_config: {pipeline_stage: 5, micro_batch_num: 10}
parallel: {pipeline_config: {pipeline_interleave: True, pipeline_scheduler: 1f1b}}
"""


def test_interleaved_offset_and_recompute_as_mindformers_documents():
    # MindFormers logs "num_layers per stage: [[4, 5, 5, 5, 5], [5, 5, 5, 5, 4]]" for this offset, and
    # for recompute [[2,1,0,0,0],[1,0,0,0,0]]: 2 layers of chunk 0 / stage 0 (layers 0-3), 1 of chunk 0 /
    # stage 1 (layers 4-8), 1 of chunk 1 / stage 0 (layers 24-28).
    result, cfg = run(INTERLEAVED + "recompute_config: {recompute: [[2, 1, 0, 0, 0], [1, 0, 0, 0, 0]]}")
    p = cfg.parallelism
    assert p.pipeline_parallel_interleave_num == 2 and p.pipeline_parallel_schedule == "1f1b"
    assert p.pipeline_parallel_layers_per_stage == [4, 5, 5, 5, 5, 5, 5, 5, 5, 4]
    assert cfg.recompute.full_recompute_layer == ["0-1", "4", "24"]


def test_per_stage_counts_spread_round_robin_over_chunks():
    # MindFormers' log for 'feed_forward\.w3\.matmul': [2, 1, 0, 0, 0] with two chunks per stage:
    # [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]] -> layers 0 (chunk 0, stage 0), 4 (chunk 0, stage 1), 24 (chunk 1, stage 0)
    result, cfg = run(INTERLEAVED + "recompute_config: {select_recompute: {'feed_forward\\.w3\\.matmul': "
                      "[2, 1, 0, 0, 0]}}")
    assert (cfg.recompute.mode, cfg.recompute.select_module) == ("select", {"feed_forward": ["0", "4", "24"]})


def test_selective_and_communication_recompute():
    result, cfg = run("recompute_config: {select_recompute: True, select_comm_recompute: True}")
    assert cfg.recompute.select_module == {"feed_forward": ["0-3"]}  # MindFormers' default operators live there
    assert cfg.recompute_comm.enable and cfg.recompute_comm.select_module == {"attention_norm": ["0-3"],
                                                                               "ffn_norm": ["0-3"]}
    result, cfg = run("recompute_config: {select_recompute: ['.*\\.activation']}")
    assert cfg.recompute.mode == "None"
    assert line(result, "recompute_config.select_recompute").kind == "dropped"


def test_recompute_without_a_layer_count_asks_for_specs():
    base = _merge(BASE, {"recompute_config": {"recompute": True}})
    del base["model"]["model_config"]["num_layers"]
    result = migrate_legacy(base)
    assert line(result, "recompute_config.recompute").kind == "action"


def test_swap_default_strategy():
    _, cfg = run("swap_config: {swap: True}")
    assert [(s.op_name, s.layers) for s in cfg.swap.op_swap] == [("attention", ["0-3"])]


# -- data, steps, optimizer, schedule -------------------------------------------------------------------
def test_steps_from_epochs_and_samples():
    result, cfg = run("runner_config: {epochs: 3, batch_size: 2}\nparallel_config: {data_parallel: 2}\n"
                      "train_dataset: {data_loader: {sizes: [100, 0, 0]}, drop_remainder: False}")
    assert cfg.training.steps == 3 * 25  # ceil(100 / 4) per epoch when the remainder is kept
    assert "training.steps = epochs 3" in line(result, "runner_config.epochs").message


def test_mindrecord_needs_conversion_and_steps_by_hand():
    result, cfg = run("train_dataset: {data_loader: {type: MindDataset, dataset_dir: /data/mr, shuffle: True}, "
                      "input_columns: [input_ids]}")
    loader = cfg.train_dataset.dataloader
    assert (loader.type, loader.shuffle, loader.column_names) == ("BlendedMegatronDatasetDataLoader", True,
                                                                  ["input_ids", "labels", "loss_mask"])
    assert loader.extra["config"]["create_attention_mask"] is False
    message = line(result, "train_dataset.data_loader.type").message
    assert message.startswith("MindRecord data ('/data/mr') (MindDataset) cannot be read by mf")
    assert "`mf data preprocess --input CORPUS.jsonl" in message
    assert cfg.training.steps == 1000 and line(result, "runner_config.epochs").kind == "action"


def test_optimizer_defaults_of_mindformers_are_written():
    result, cfg = run("optimizer: {type: FP32StateAdamWeightDecay, learning_rate: 1.e-4}")
    o = cfg.optimizer
    assert (o.type, o.betas, o.eps, o.weight_decay) == ("AdamW", [0.9, 0.999], 1e-6, 0.0)
    assert "no bias correction" in line(result, "optimizer.type").message
    assert cfg.lr_scheduler.learning_rate == 1e-4  # no lr_schedule: the optimizer's rate is the one
    _, cfg = run("optimizer: {type: AdamW, beta1: 0.8, beta2: 0.9}")
    assert cfg.optimizer.betas == [0.8, 0.9] and cfg.optimizer.eps == 1e-8
    result, cfg = run("optimizer: {type: Came, scale_parameter: True}")
    assert cfg.optimizer.type == "AdamW" and line(result, "optimizer.type").kind == "dropped"
    assert line(result, "optimizer.scale_parameter").kind == "dropped"


def test_lr_schedule():
    result, cfg = run("lr_schedule: {type: CosineWithWarmUpLR, learning_rate: 1.e-3, warmup_steps: 10, "
                      "total_steps: 500, lr_end: 1.e-5, weird: 1}")
    assert cfg.lr_scheduler.type == "CosineWithWarmUpLR"
    assert cfg.lr_scheduler.extra == {"warmup_steps": 10, "total_steps": 500, "lr_end": 1e-5}
    assert line(result, "lr_schedule.weird").kind == "dropped"
    result, cfg = run("lr_schedule: {type: CosineAnnealingLR, learning_rate: 1.e-3, t_max: 10}")
    assert cfg.lr_scheduler.type is None and cfg.lr_scheduler.learning_rate == 1e-3
    assert line(result, "lr_schedule.type").kind == "dropped"


# -- run: checkpoints, callbacks, clipping --------------------------------------------------------------
def test_checkpoint_loading_and_resume():
    _, cfg = run("load_checkpoint: /ckpt/run1\nresume_training: True")
    assert (cfg.checkpoint.load_path, cfg.checkpoint.no_load_optim) == ("/ckpt/run1", False)
    result, cfg = run("load_checkpoint: /ckpt/llama.ckpt")
    assert cfg.checkpoint.load_path == "/ckpt/llama.ckpt" and cfg.checkpoint.no_load_optim is True
    assert "not a MindSpore checkpoint file" in line(result, "load_checkpoint", "action").message
    result, _ = run("resume_training: True")
    assert line(result, "resume_training").kind == "action"


def test_callbacks_without_checkpoint_monitor_save_nothing():
    result, cfg = run("callbacks: [{type: MFLossMonitor, per_print_times: 5}]")
    assert cfg.checkpoint.enable_save is False and cfg.monitor.log_interval == 5
    assert "no CheckpointMonitor" in line(result, "callbacks").message


def test_clipping_and_loss_scale():
    result, cfg = run("runner_wrapper: {use_clip_grad: False, scale_sense: {type: DynamicLossScaleUpdateCell}}")
    assert cfg.training.max_norm == 1.0
    assert {line(result, "runner_wrapper.use_clip_grad").kind, line(result, "runner_wrapper.scale_sense").kind} == {
        "dropped"}


def test_noop_values_are_unneeded_and_real_ones_dropped():
    result, _ = run("runner_config: {sink_mode: False}\nlayer_scale: False\nlayer_decay: 0.65")
    assert line(result, "runner_config.sink_mode").message.startswith("False loses nothing: ")
    assert line(result, "layer_decay").message.startswith("layer_scale is off, so nothing is lost: ")
    result, _ = run("layer_scale: True\nlayer_decay: 0.65")
    assert {line(result, "layer_scale").kind, line(result, "layer_decay").kind} == {"dropped"}


def test_malformed_values_never_escape_as_tracebacks():
    """A wrong kind of value in any place (null, a list, a mapping: what breaks lookups and arithmetic):
    the migration either works or raises ConfigError (one line). Validation of the output is
    mf-config's loader, tested on its own."""
    from pathlib import Path

    from mf_config.legacy.source import LegacySource

    raw = yaml.safe_load((Path(__file__).parent / "data" / "legacy" / "pretrain_deepseek3_small_moe.yaml").read_text())
    paths = {p[:i] for p in LegacySource(raw).leaves() for i in range(1, len(p) + 1)}
    values = (None, [[1], [2, 3]], {"a": 1})  # one per path, in turn (kept short: ~200 migrations)
    for i, path in enumerate(sorted(paths, key=str)):
        broken = copy.deepcopy(raw)
        node = broken
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = values[i % len(values)]
        try:
            migrate_legacy(broken).to_yaml()
        except ConfigError as exc:
            assert "\n" not in str(exc)


def test_deepseek_moe_layers_select_the_moe_module():
    result, cfg = run("model: {arch: {type: DeepseekV3ForCausalLM}, model_config: {type: DeepseekV3Config, "
                      "n_kv_heads: 4, num_heads: 4, hidden_size: 64}}\n"
                      "moe_config: {expert_num: 4, num_experts_chosen: 2, first_k_dense_replace: 1}\n"
                      "recompute_config: {select_recompute: True}", validate=False)
    assert result.new["recompute"]["select_module"] == {"feed_forward": ["0"], "moe": ["1-3"]}
