"""Every rule of the reference's tables, and each rule mf adds, at its boundary: the last value that
passes and the first that fails. The minimal config (conftest) has an 8-layer, 8-head model."""

from __future__ import annotations

import pytest

from mf_config import ConfigError, even_layer_counts, pipeline_layer_placement


def _fails(build, path: str, text: str = "", **sections) -> str:
    with pytest.raises(ConfigError) as info:
        build(**sections)
    message = str(info.value)
    assert message.startswith(path + ":"), message
    assert text in message, message
    return message


# ----------------------------------------------------------------------------- training

def test_batch_sizes_must_be_positive(build):
    cfg = build(training={"local_batch_size": 1, "global_batch_size": 1})
    assert (cfg.training.local_batch_size, cfg.training.global_batch_size) == (1, 1)
    _fails(build, "training.global_batch_size", "must be positive, got 0", training={"global_batch_size": 0})
    _fails(build, "training.local_batch_size", "must be positive, got 0", training={"local_batch_size": 0})


def test_data_parallel_times_local_batch_must_not_exceed_global_batch(build):
    build(parallelism={"data_parallel_shard": 4}, training={"local_batch_size": 2, "global_batch_size": 8})
    _fails(build, "training.global_batch_size", "data_parallel_shard x training.local_batch_size = 8, got 7",
           parallelism={"data_parallel_shard": 4}, training={"local_batch_size": 2, "global_batch_size": 7})
    # With data_parallel_shard -1 the data-parallel size is only known at run time (>= 1).
    build(training={"local_batch_size": 2, "global_batch_size": 2})
    _fails(build, "training.global_batch_size", "training.local_batch_size (2)",
           training={"local_batch_size": 2, "global_batch_size": 1})


def test_a_global_batch_that_does_not_divide_evenly_is_accepted(build):
    # The reference: accumulation steps are floored, not an error.
    cfg = build(parallelism={"data_parallel_shard": 3}, training={"local_batch_size": 1, "global_batch_size": 8})
    assert cfg.training.global_batch_size == 8


def test_max_norm_must_be_positive_and_steps_too(build):
    assert build(training={"max_norm": 0.001}).training.max_norm == 0.001
    _fails(build, "training.max_norm", "must be positive", training={"max_norm": -1.0})
    _fails(build, "training.steps", "must be positive", training={"steps": 0})


# ----------------------------------------------------------------------------- parallelism

def test_data_parallel_shard_is_minus_one_or_positive(build):
    assert build(parallelism={"data_parallel_shard": -1}).parallelism.data_parallel_shard == -1
    cfg = build(parallelism={"data_parallel_shard": 2}, training={"global_batch_size": 2})
    assert cfg.parallelism.data_parallel_shard == 2
    _fails(build, "parallelism.data_parallel_shard", "got 0", parallelism={"data_parallel_shard": 0})


@pytest.mark.parametrize("name", ["tensor_parallel", "context_parallel", "pipeline_parallel", "expert_parallel",
                                  "pipeline_parallel_interleave_num", "npu_nums_per_device"])
def test_parallel_degrees_are_positive_ints(build, name):
    _fails(build, f"parallelism.{name}", "must be positive", parallelism={name: 0})
    _fails(build, f"parallelism.{name}", "expected an integer", parallelism={name: 2.0})


@pytest.mark.parametrize("policy", ["always", "never", "default"])
def test_reshard_after_forward_policy_choices(build, policy):
    assert build(parallelism={"reshard_after_forward_policy": policy}).parallelism.reshard_after_forward_policy == policy


def test_reshard_after_forward_policy_rejects_others(build):
    _fails(build, "parallelism.reshard_after_forward_policy", "got 'Always'; did you mean 'always'?",
           parallelism={"reshard_after_forward_policy": "Always"})


def test_alltoall_deredundancy_needs_expert_parallel_at_least_npu_nums_per_device(build):
    ok = {"moe_token_dispatcher_type": "alltoall_deredundancy", "expert_parallel": 8, "npu_nums_per_device": 8}
    assert build(parallelism=ok).parallelism.expert_parallel == 8
    assert build(parallelism={**ok, "expert_parallel": 4, "npu_nums_per_device": 4})
    _fails(build, "parallelism.expert_parallel", "npu_nums_per_device (8)", parallelism={**ok, "expert_parallel": 4})
    # plain alltoall has no such requirement
    build(parallelism={"expert_parallel": 2, "npu_nums_per_device": 8})


def test_moe_token_dispatcher_type_choices(build):
    for value in ("alltoall", "alltoall_deredundancy"):
        build(parallelism={"moe_token_dispatcher_type": value, "expert_parallel": 8})
    _fails(build, "parallelism.moe_token_dispatcher_type", "must be one of",
           parallelism={"moe_token_dispatcher_type": "allgather"})


def test_sequence_parallel_follows_tensor_parallel(build):
    # SP is on whenever TP > 1; the field may say so, or stay False (the reference's default).
    build(parallelism={"tensor_parallel": 2, "sequence_parallel": True})
    build(parallelism={"tensor_parallel": 2, "sequence_parallel": False})
    # True without TP has nothing to split: accepted here, a notice of mf-trainer's preflight
    build(parallelism={"sequence_parallel": True})
    build(parallelism={"context_parallel": 2, "sequence_parallel": True})


def test_tensor_parallel_divides_attention_heads(build):
    build(parallelism={"tensor_parallel": 4})
    _fails(build, "parallelism.tensor_parallel", "num_attention_heads (8)", parallelism={"tensor_parallel": 16})


def test_hybrid_context_parallel_needs_a_ulysses_degree_that_divides_it(build):
    hybrid = {"context_parallel": 4, "context_parallel_method": "hybrid"}
    assert build(parallelism={**hybrid, "ulysses_degree_in_cp": 2}).parallelism.ulysses_degree_in_cp == 2
    _fails(build, "parallelism.ulysses_degree_in_cp", "required", parallelism=hybrid)
    _fails(build, "parallelism.ulysses_degree_in_cp", "1 < degree", parallelism={**hybrid, "ulysses_degree_in_cp": 4})
    _fails(build, "parallelism.ulysses_degree_in_cp", "1 < degree",
           parallelism={"context_parallel": 6, "context_parallel_method": "hybrid", "ulysses_degree_in_cp": 4})


def test_ulysses_and_colossal_degrees(build):
    build(parallelism={"context_parallel": 4, "context_parallel_method": "ulysses", "ulysses_degree_in_cp": 4})
    build(parallelism={"context_parallel": 4, "context_parallel_method": "ulysses"})
    _fails(build, "parallelism.ulysses_degree_in_cp", "must equal context_parallel (4)",
           parallelism={"context_parallel": 4, "context_parallel_method": "ulysses", "ulysses_degree_in_cp": 2})
    # with colossal (a pure ring) the degree has nothing to act on: mf-trainer's preflight notices it
    build(parallelism={"context_parallel": 4, "ulysses_degree_in_cp": 2})
    _fails(build, "parallelism.context_parallel_method", "must be one of",
           parallelism={"context_parallel_method": "ring"})


def test_context_parallel_async_and_mask_type(build):
    build(parallelism={"context_parallel": 2, "context_parallel_async": True})
    build(parallelism={"context_parallel_async": True})   # nothing to overlap at cp 1: a preflight notice
    _fails(build, "parallelism.context_parallel", "num_attention_heads (8)",
           parallelism={"context_parallel": 16, "context_parallel_method": "ulysses", "context_parallel_async": True})
    _fails(build, "parallelism.context_parallel_mask_type", "must be one of 'causal'",
           parallelism={"context_parallel_mask_type": "full"})


@pytest.mark.parametrize("name", ["pipeline_parallel_overlap_p2p", "pipeline_parallel_overlap_b_f",
                                  "pipeline_parallel_enable_dxdw_split"])
def test_pipeline_switches_without_a_pipeline_are_accepted(build, name):
    build(parallelism={"pipeline_parallel": 2, name: True})
    build(parallelism={name: True})   # nothing to act on at pipeline_parallel 1: a preflight notice


def test_interleaving_needs_a_pipeline_and_a_1f1b_schedule(build):
    build(parallelism={"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2})
    build(parallelism={"pipeline_parallel_interleave_num": 2})   # at pipeline_parallel 1: a preflight notice
    _fails(build, "parallelism.pipeline_parallel_interleave_num", "'gpipe'",
           parallelism={"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2,
                        "pipeline_parallel_schedule": "gpipe"})
    _fails(build, "parallelism.pipeline_parallel_schedule", "must be one of '1f1b', 'gpipe', 'interleaved_1f1b', 'zbv'",
           parallelism={"pipeline_parallel_schedule": "zero_bubble"})
    _fails(build, "parallelism.pipeline_parallel_schedule", "interleaved_1f1b needs pipeline_parallel_interleave_num > 1",
           parallelism={"pipeline_parallel": 2, "pipeline_parallel_schedule": "interleaved_1f1b"})
    build(parallelism={"pipeline_parallel": 2, "pipeline_parallel_schedule": "interleaved_1f1b",
                       "pipeline_parallel_interleave_num": 2})


def test_zbv_has_two_chunks_in_a_v(build):
    zbv = {"pipeline_parallel": 2, "pipeline_parallel_schedule": "zbv"}
    build(parallelism=zbv)
    build(parallelism={**zbv, "pipeline_parallel_interleave_num": 2})
    _fails(build, "parallelism.pipeline_parallel_interleave_num", "exactly two model chunks",
           parallelism={**zbv, "pipeline_parallel_interleave_num": 3})
    build(parallelism={"pipeline_parallel_schedule": "zbv"})   # at pipeline_parallel 1: a preflight notice
    # 8 layers on 2 ranks x 2 chunks; chunk 1 of rank i is virtual stage 3 - i (a V)
    assert pipeline_layer_placement(None, 2, 1, 8, schedule="zbv") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert pipeline_layer_placement(["0-2, 7", "3, 4-6"], 2, 1, 8, schedule="zbv") == [
        [0, 1, 2], [3], [4, 5, 6], [7]]
    _fails(build, "parallelism.pipeline_parallel_layers_per_stage", "one layer count per virtual stage",
           parallelism={**zbv, "pipeline_parallel_layers_per_stage": [4, 4]})


def test_auto_placement_puts_the_remainder_where_mindformers_does():
    """MindFormers (parallel_core/inference/utils.get_num_layers_and_offset, offset 0): the extra
    layers go one each to the stages before the last, walking towards the first."""
    assert even_layer_counts(10, 4) == [2, 3, 3, 2]
    assert even_layer_counts(11, 4) == [3, 3, 3, 2]
    assert even_layer_counts(9, 4) == [2, 2, 3, 2]
    assert even_layer_counts(8, 4) == [2, 2, 2, 2]
    assert pipeline_layer_placement("auto", 3, 1, 8) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert pipeline_layer_placement(None, 2, 2, 10) == [[0, 1], [2, 3, 4], [5, 6, 7], [8, 9]]


def test_pipeline_layers_per_stage_forms(build):
    pp = {"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2}
    build(parallelism={**pp, "pipeline_parallel_layers_per_stage": "auto"})
    build(parallelism={**pp, "pipeline_parallel_layers_per_stage": [1, 3, 3, 1]})
    build(parallelism={**pp, "pipeline_parallel_layers_per_stage": ["0, 4-6", "1-3, 7"]})
    _fails(build, "parallelism.pipeline_parallel_layers_per_stage", "one layer count per virtual stage",
           parallelism={**pp, "pipeline_parallel_layers_per_stage": [4, 4]})
    _fails(build, "parallelism.pipeline_parallel_layers_per_stage[1]", "virtual stage 1 must start at layer 1",
           parallelism={**pp, "pipeline_parallel_layers_per_stage": ["0, 4-6", "2-3, 7"]})
    _fails(build, "parallelism.pipeline_parallel_layers_per_stage", "at least one layer per virtual stage",
           model={"num_hidden_layers": 3}, parallelism={**pp, "pipeline_parallel_layers_per_stage": "auto"})
    _fails(build, "parallelism.pipeline_parallel_layers_per_stage", "mixes",
           parallelism={**pp, "pipeline_parallel_layers_per_stage": [1, "2-7"]})


def test_the_reference_manuals_uneven_placement_example(build):
    # 10 layers, pp 2, interleave 2: stage 0 runs 0-1 then 4-8, stage 1 runs 2-3 then 9.
    cfg = build(model={"num_hidden_layers": 10, "num_attention_heads": 8},
                parallelism={"pipeline_parallel": 2, "pipeline_parallel_interleave_num": 2,
                             "pipeline_parallel_layers_per_stage": ["0-1, 4-8", "2-3, 9"]})
    assert cfg.parallelism.pipeline_parallel_layers_per_stage == ["0-1, 4-8", "2-3, 9"]


def test_expert_parallel_divides_experts_and_the_dense_grid(build):
    build(model={"n_routed_experts": 8}, parallelism={"expert_parallel": 4})
    _fails(build, "parallelism.expert_parallel", "number of experts (6)",
           model={"n_routed_experts": 6}, parallelism={"expert_parallel": 4})
    build(parallelism={"data_parallel_shard": 2, "tensor_parallel": 2, "expert_parallel": 4},
          training={"global_batch_size": 2})
    _fails(build, "parallelism.expert_parallel", "context_parallel x tensor_parallel (4)",
           parallelism={"data_parallel_shard": 2, "tensor_parallel": 2, "expert_parallel": 8},
           training={"global_batch_size": 2})


def test_cpu_offload_parses_on_every_device(build):
    # what each device makes of it (a notice on CPU) is mf-trainer's preflight's
    build(parallelism={"cpu_offload": True})
    build(context={"device_target": "CPU"}, parallelism={"cpu_offload": True})


def test_data_parallel_shard_strategy_choices(build):
    for value in ("optim_grads_params", "optim_grads", "optim", "no_shard"):
        build(parallelism={"data_parallel_shard_strategy": value})
    _fails(build, "parallelism.data_parallel_shard_strategy", "must be one of",
           parallelism={"data_parallel_shard_strategy": "zero3"})


# ----------------------------------------------------------------------------- optimizer / model

def test_optimizer_betas_and_weight_decay_rules(build):
    assert build(optimizer={"betas": [0.0, 0.999]}).optimizer.betas == [0.0, 0.999]
    _fails(build, "optimizer.betas[0]", "[0.0, 1.0)", optimizer={"betas": [1.0, 0.9]})
    _fails(build, "optimizer.betas", "one or two", optimizer={"betas": [0.9, 0.9, 0.9]})
    _fails(build, "optimizer.weight_decay_exclude", "weight_decay_include also names",
           optimizer={"weight_decay_include": ["norm"], "weight_decay_exclude": ["bias", "norm"]})


def test_model_needs_a_type_and_sane_counts(build):
    build(model={"model_type": None, "architectures": "LlamaForCausalLM"})
    _fails(build, "model.num_experts_per_tok", "number of experts (4)",
           model={"n_routed_experts": 4, "num_experts_per_tok": 5})


# ----------------------------------------------------------------------------- profiler / monitor

def test_profiler_steps_positive_and_ordered(build):
    assert build(profiler={"start_step": 3, "end_step": 3}).profiler.end_step == 3
    _fails(build, "profiler.end_step", "profiler.start_step (4), got 3", profiler={"start_step": 4, "end_step": 3})
    _fails(build, "profiler.start_step", "must be positive", profiler={"start_step": 0})
    _fails(build, "profiler.end_step", "must be positive", profiler={"end_step": -1})


def test_a_profiler_window_past_the_run_is_accepted(build):
    build(profiler={"enable_profiling": True, "start_step": 1, "end_step": 100})
    build(profiler={"enable_profiling": False, "start_step": 1, "end_step": 500})
    # cut at the last step (a notice of mf-trainer's preflight), as a short run of a long recipe needs
    build(profiler={"enable_profiling": True, "start_step": 1, "end_step": 101})


@pytest.mark.parametrize("level", [0, 1, 2])
def test_profiler_levels(build, level):
    assert build(profiler={"profiler_level": level}).profiler.profiler_level == level


def test_moe_monitor_layers_in_range(build):
    assert build(monitor={"moe_monitor": {"target_layers": [0, 7]}}).monitor.moe_monitor.target_layers == [0, 7]
    _fails(build, "monitor.moe_monitor.target_layers[0]", "must be >= 0",
           monitor={"moe_monitor": {"target_layers": [-1]}})


# ----------------------------------------------------------------------------- recompute / swap

def test_recompute_mode_none_is_the_string(build):
    assert build().recompute.mode == "None"
    _fails(build, "recompute.mode", "must be one of 'None', 'full', 'select', got null", recompute={"mode": None})


def test_full_recompute_needs_layers_and_they_are_closed_ranges(build):
    cfg = build(recompute={"mode": "full", "full_recompute_layer": ["0-3"]})
    assert cfg.recompute.full_recompute_layer == ["0-3"]
    build(recompute={"mode": "full", "full_recompute_layer": ["0-3", "5", "7"]})
    _fails(build, "recompute.full_recompute_layer", "required", recompute={"mode": "full"})
    _fails(build, "recompute.full_recompute_layer", "required", recompute={"mode": "full", "full_recompute_layer": []})
    _fails(build, "recompute.full_recompute_layer[1]", "must not overlap",
           recompute={"mode": "full", "full_recompute_layer": ["0-3", "3"]})
    _fails(build, "recompute.full_recompute_layer[0]", "valid layers 0-7",
           recompute={"mode": "full", "full_recompute_layer": ["8"]})


def test_select_recompute_needs_modules(build):
    cfg = build(recompute={"mode": "select", "select_module": {"attention": ["0-1"], "mlp": ["2"]}})
    assert cfg.recompute.select_module == {"attention": ["0-1"], "mlp": ["2"]}
    _fails(build, "recompute.select_module", "required", recompute={"mode": "select"})
    _fails(build, "recompute.select_module", "at least one module", recompute={"mode": "select", "select_module": {}})
    _fails(build, "recompute.select_module.mlp", "list of layer specs",
           recompute={"mode": "select", "select_module": {"mlp": "2"}})


def test_switched_off_recompute_keeps_its_lists_but_still_checks_them(build):
    cfg = build(recompute={"mode": "None", "full_recompute_layer": ["0-3"]})
    assert cfg.recompute.full_recompute_layer == ["0-3"]
    _fails(build, "recompute.full_recompute_layer[0]", "out of range",
           recompute={"mode": "None", "full_recompute_layer": ["0-9"]})


def test_recompute_comm_enable_needs_select_module(build):
    build(recompute_comm={"enable": True, "select_module": {"attention.qkv": ["0-3"]}})
    build(recompute_comm={"enable": False, "select_module": {"attention.qkv": ["0-3"]}})
    _fails(build, "recompute_comm.select_module", "required", recompute_comm={"enable": True})


def test_swap_default_prefetch_range_against_the_model(build):
    on = {"enable": True, "layer_swap": [{"layers": ["0-1"]}]}
    build(swap={**on, "default_prefetch": 1})
    build(swap={**on, "default_prefetch": 7})
    _fails(build, "swap.default_prefetch", "[1, 7], got 8", swap={**on, "default_prefetch": 8})
    _fails(build, "swap.default_prefetch", "must be positive", swap={**on, "default_prefetch": 0})
    # only checked when swap is on
    build(swap={"enable": False, "default_prefetch": 8})


def test_swap_prefetch_without_a_declared_layer_count(load_text):
    fragment = ("model:\n  model_type: x\nswap:\n  enable: true\n  default_prefetch: 50\n"
                "  layer_swap:\n    - layers: ['0-60']\n")
    assert load_text(fragment).swap.default_prefetch == 50


def test_swap_entries(build):
    cfg = build(swap={"enable": True, "op_swap": [{"op_name": "attention", "layers": ["0"]},
                                                  {"op_name": "mlp", "layers": ["0-1"]}]})
    assert [e.op_name for e in cfg.swap.op_swap] == ["attention", "mlp"]
    _fails(build, "swap.op_swap[1].layers", "already offloaded by swap.op_swap[0]",
           swap={"op_swap": [{"op_name": "mlp", "layers": ["0-2"]}, {"op_name": "mlp", "layers": ["2"]}]})
    _fails(build, "swap.layer_swap[0].layers", "required", swap={"layer_swap": [{}]})
    _fails(build, "swap.op_swap[0].layers", "layer 1 is offloaded whole by swap.layer_swap[0], its 'mlp' with it",
           swap={"layer_swap": [{"layers": ["0-1"]}], "op_swap": [{"op_name": "mlp", "layers": ["1-2"]}]})
    # CPU is accepted (mf-trainer offloads there too, with a notice that nothing is freed)
    build(context={"device_target": "CPU"}, swap=dict(enable=True, layer_swap=[{"layers": ["0"]}]))


def test_swap_default_prefetch_of_a_one_layer_model(load_text):
    fragment = ("model:\n  model_type: x\n  num_hidden_layers: 1\nswap:\n  enable: true\n"
                "  layer_swap:\n    - layers: ['0']\n")
    assert load_text(fragment).swap.default_prefetch == 1      # [1, num_layers - 1] is empty: 1 stays valid
    with pytest.raises(ConfigError, match=r"swap.default_prefetch: must be in .* = \[1, 1\], got 2"):
        load_text(fragment + "  default_prefetch: 2\n")


# ----------------------------------------------------------------------------- callbacks / extensions

def test_callbacks_need_a_type_and_pass_the_rest_through(build):
    cfg = build(callbacks=[{"type": "MyCustomCallback", "log_interval": 10}])
    assert cfg.callbacks[0].type == "MyCustomCallback"
    assert cfg.callbacks[0].kwargs() == {"log_interval": 10}
    _fails(build, "callbacks[0].type", "required", callbacks=[{"log_interval": 10}])
    _fails(build, "callbacks[0]", "expected a mapping", callbacks=["MyCustomCallback"])


def test_run_modes_require_their_sections(load_text):
    with pytest.raises(ConfigError, match=r"^training: required section is missing"):
        load_text("model:\n  model_type: x\ntrain_dataset:\n  dataloader:\n    type: X\n", complete=False)
    with pytest.raises(ConfigError, match=r"^eval_dataset: required section is missing"):
        load_text("run_mode: eval\nmodel:\n  model_type: x\n", complete=False)
    cfg = load_text("run_mode: eval\nmodel:\n  model_type: x\neval_dataset:\n  dataloader:\n    type: X\n",
                    complete=False)
    assert cfg.eval_dataset.eval_iters == 10


def test_a_finetune_may_leave_the_model_to_its_base(load_text):
    data = "train_dataset:\n  dataloader:\n    type: X\ntraining:\n  steps: 2\n"
    cfg = load_text("run_mode: finetune\ncheckpoint:\n  load_path: base\n" + data, complete=False)
    assert cfg.model.model_type is None and cfg.model.extra == {}
    with pytest.raises(ConfigError, match=r"^model.model_type: .*a run_mode finetune with checkpoint.load_path "
                                          r"may omit the model section"):
        load_text("run_mode: finetune\n" + data, complete=False)
    with pytest.raises(ConfigError, match=r"^model: required section is missing"):
        load_text(data, complete=False)


def test_predict_needs_prompts_and_a_tokenizer(load_text):
    base = "run_mode: predict\nmodel:\n  model_type: x\n"
    with pytest.raises(ConfigError, match=r"^inference.prompts: run_mode predict needs"):
        load_text(base, complete=False)
    with pytest.raises(ConfigError, match=r"^tokenizer.path: run_mode predict needs a tokenizer"):
        load_text(base + "inference:\n  prompts: [hello]\n", complete=False)
    cfg = load_text(base + "inference:\n  prompts: [hello]\ntokenizer:\n  path: tok.model\n", complete=False)
    assert cfg.inference.prompts == ["hello"]
    with pytest.raises(ConfigError, match=r"^inference.input_file: give inference.prompts or"):
        load_text(base + "inference:\n  prompts: [hi]\n  input_file: p.jsonl\ntokenizer:\n  path: t\n",
                  complete=False)


def test_lora_section_present_or_absent(build):
    assert build().lora is None
    cfg = build(lora={"target_modules": r"attention\.w[qkv]", "exclude_layers": ["0", "6-7"]})
    assert (cfg.lora.lora_rank, cfg.lora.lora_alpha, cfg.lora.lora_dropout) == (8, 16.0, 0.0)
    _fails(build, "lora.lora_rank", "must be positive", lora={"target_modules": "q", "lora_rank": 0})


def test_inference_ranges(build):
    cfg = build(inference={"top_p": 1.0, "top_k": 0, "temperature": 0.01})
    assert cfg.inference.top_p == 1.0
    _fails(build, "inference.top_p", "(0.0, 1.0]", inference={"top_p": 1.5})
    _fails(build, "inference.max_new_tokens", "must be positive", inference={"max_new_tokens": 0})
    _fails(build, "inference.prompts", "must not be empty", inference={"prompts": []})


# ----------------------------------------------------------------------------- Megatron loader keys

def _megatron(**config):
    return {"dataloader": {"type": "BlendedMegatronDatasetDataLoader", "config": config}}


def test_megatron_data_path_forms(build):
    build(train_dataset=_megatron(data_path=["0.3", "/a", 0.7, "/b"]))
    build(train_dataset=_megatron(data_path=["/a", "/b", "/c"]))
    build(train_dataset=_megatron(data_path=["/a", "/b"]))
    _fails(build, "train_dataset.dataloader.config.data_path[0]", ">= 0",
           train_dataset=_megatron(data_path=["-1", "/a"]))
    _fails(build, "train_dataset.dataloader.config.data_path", "all be zero",
           train_dataset=_megatron(data_path=["0", "/a"]))
    _fails(build, "train_dataset.dataloader.config.data_path", "non-empty list",
           train_dataset=_megatron(data_path="/a"))


def test_megatron_split_sizes_and_sequence(build):
    build(train_dataset=_megatron(split="969, 30, 1", seq_length=256))
    _fails(build, "train_dataset.dataloader.config.split", "comma-separated",
           train_dataset=_megatron(split="1,0,0,0"))
    _fails(build, "train_dataset.dataloader.config.split", "at least one split",
           train_dataset=_megatron(split="0,0,0"))
    _fails(build, "train_dataset.dataloader.config.seq_length", "model.seq_length (256)",
           train_dataset=_megatron(seq_length=512))
    _fails(build, "train_dataset.dataloader.config.create_attention_mask", "boolean",
           train_dataset=_megatron(create_attention_mask="no"))
    _fails(build, "train_dataset.dataloader.sizes", "three non-negative",
           train_dataset={"dataloader": {"type": "BlendedMegatronDatasetDataLoader", "sizes": [10, 0]}})
    _fails(build, "train_dataset.dataloader.column_names[1]", "Megatron loader produces",
           train_dataset={"dataloader": {"type": "BlendedMegatronDatasetDataLoader",
                                         "column_names": ["input_ids", "pixels"]}})


def test_other_loaders_keys_pass_through_unchecked(build):
    cfg = build(train_dataset={"dataloader": {"type": "MyLoader", "config": {"seq_length": "long"}}})
    assert cfg.train_dataset.dataloader.extra == {"config": {"seq_length": "long"}}
