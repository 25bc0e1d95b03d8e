"""Defaults, types and pass-through keys, section by section, as the reference's tables give them."""

from __future__ import annotations

import dataclasses

import pytest

from mf_config import (
    ConfigError,
    ExtraSection,
    Section,
    TrainConfig,
    config_to_dict,
    load_config,
)
from mf_config.schema import declared_fields

# The reference's tables (seeds/000), default by default; mf's extensions follow each section.
SEED_DEFAULTS = {
    "checkpoint": {
        "enable_save": True, "save_path": "", "save_max": 5, "save_interleaved_steps": 1000,
        "no_save_optim": False, "async_save": False, "prefix": "checkpoint", "remove_redundancy": False,
        "load_path": "", "load_balanced": False, "no_load_optim": False, "load_worker_number": 1,
        "save_global_layout_cache": True, "load_rng_state": True,
    },
    "training": {
        "steps": 1000, "local_batch_size": 1, "global_batch_size": 1, "max_norm": 1.0, "seed": 42,
        "deterministic": False, "max_consecutive_nonfinite": 5, "max_skipped_fraction": 0.1,
        "hang_timeout_s": 600.0,
    },
    "parallelism": {
        "data_parallel_shard": -1, "data_parallel_shard_strategy": "optim_grads_params",
        "reshard_after_forward_policy": "default", "cpu_offload": False, "disable_gradient_division": True,
        "tensor_parallel": 1, "context_parallel": 1, "context_parallel_method": "colossal",
        "context_parallel_async": False, "ulysses_degree_in_cp": None, "context_parallel_mask_type": "causal",
        "pipeline_parallel": 1, "pipeline_parallel_layers_per_stage": None, "pipeline_parallel_schedule": "1f1b",
        "pipeline_parallel_interleave_num": 1, "pipeline_parallel_overlap_p2p": False,
        "pipeline_parallel_overlap_b_f": False, "pipeline_parallel_enable_dxdw_split": False,
        "sequence_parallel": False, "expert_parallel": 1, "npu_nums_per_device": 8,
        "moe_token_dispatcher_type": "alltoall",
    },
    "optimizer": {
        "type": "AdamW", "betas": [0.9, 0.95], "eps": 1.0e-8, "weight_decay": 0.01,
        "weight_decay_include": None, "weight_decay_exclude": None,
    },
    "lr_scheduler": {"type": None, "learning_rate": 1e-5},
    "train_dataset": {
        "dataloader": {"type": None, "shuffle": False, "column_names": ["input_ids", "labels"],
                       "python_multiprocessing": False},
        "drop_remainder": True, "num_parallel_workers": 8, "prefetch_size": 1, "numa_enable": False,
    },
    "model": {"model_type": None, "architectures": None},
    "monitor": {
        "train_state": {"local_norm": "", "local_loss": False, "device_norm": False, "device_loss": False},
        "moe_monitor": {"save_tokens_per_expert_interval": None, "target_layers": None},
        "log_interval": 1, "tensorboard": True, "peak_flops_per_device": None,
    },
    "profiler": {
        "enable_profiling": False, "start_step": 1, "end_step": 1, "output_path": None, "profiler_rank": None,
        "profiler_level": 0, "mstx": False, "profile_memory": False, "with_stack": True, "profile_cpu": True,
    },
    "recompute": {"mode": "None", "full_recompute_layer": None, "select_module": None},
    "recompute_comm": {"enable": False, "select_module": None},
    "swap": {"enable": False, "default_prefetch": 1, "layer_swap": None, "op_swap": None},
    "callbacks": [],
    "context": {"device_target": None, "mode": 0, "device_id": 0},
    "run_mode": "train",
    "output_dir": "./output",
    "eval_dataset": None,
    "lora": None,
    "tokenizer": {"path": "", "type": "sentencepiece"},
    "inference": {
        "max_new_tokens": 128, "do_sample": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "stop_token_ids": None, "batch_size": 1, "prompts": None, "input_file": None, "output_file": None,
    },
}


def test_every_default_is_the_references():
    assert config_to_dict(TrainConfig()) == SEED_DEFAULTS


def test_dump_order_is_the_references_section_order_then_extensions():
    assert list(config_to_dict(TrainConfig())) == [
        "run_mode", "output_dir", "context",
        "checkpoint", "training", "parallelism", "optimizer", "lr_scheduler", "train_dataset", "model",
        "monitor", "profiler", "recompute", "recompute_comm", "swap", "callbacks",
        "eval_dataset", "tokenizer", "lora", "inference",
    ]


def test_sections_with_defaults_may_be_omitted(build):
    cfg = build()
    assert cfg.recompute.mode == "None" and cfg.swap.enable is False and cfg.profiler.enable_profiling is False
    assert cfg.callbacks == []


def test_a_null_section_means_its_defaults(load_text):
    cfg = load_text("recompute:\nswap:\ncallbacks:\nmonitor:\n  train_state:\n")
    assert cfg.recompute == TrainConfig().recompute and cfg.callbacks == []


def test_eval_dataset_has_train_dataset_shape_plus_eval_fields():
    from mf_config import EvalDatasetConfig, TrainDatasetConfig

    train_names = [f.name for f in declared_fields(TrainDatasetConfig)]
    eval_names = [f.name for f in declared_fields(EvalDatasetConfig)]
    assert eval_names == train_names + ["eval_interval", "eval_iters"]


# ----------------------------------------------------------------------------- pass-through keys

ALLOW_EXTRA = {
    "optimizer": {"type": "AdamW", "amsgrad": True},
    "lr_scheduler": {"type": "CosineWithWarmUpLR", "warmup_steps": 10, "min_lr": 1e-6},
    "model": {"model_type": "qwen3", "num_hidden_layers": 8, "num_attention_heads": 8, "rope_theta": 1e6},
}


def test_allow_extra_sections_keep_undeclared_keys(build):
    cfg = build(**ALLOW_EXTRA,
                train_dataset={"dataloader": {"type": "BlendedMegatronDatasetDataLoader", "sizes": [10, 0, 0]}},
                callbacks=[{"type": "Cb", "every": 3}])
    assert cfg.optimizer.extra == {"amsgrad": True}
    assert cfg.lr_scheduler.extra == {"warmup_steps": 10, "min_lr": 1e-6}
    assert cfg.model.extra["rope_theta"] == 1e6
    assert cfg.train_dataset.dataloader.extra == {"sizes": [10, 0, 0]}
    assert cfg.callbacks[0].extra == {"every": 3}


def test_kwargs_gives_the_consumer_its_arguments(build):
    cfg = build(**ALLOW_EXTRA)
    assert cfg.optimizer.kwargs() == {"betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01,
                                      "weight_decay_include": None, "weight_decay_exclude": None, "amsgrad": True}
    assert cfg.lr_scheduler.kwargs() == {"learning_rate": 1e-5, "warmup_steps": 10, "min_lr": 1e-6}
    model_kwargs = cfg.model.kwargs(exclude=("model_type", "architectures"))
    assert model_kwargs == {"num_hidden_layers": 8, "num_attention_heads": 8, "rope_theta": 1e6,
                            "vocab_size": 1000, "seq_length": 256}
    model_kwargs["rope_theta"] = 0  # a copy: the config is untouched
    assert cfg.model.extra["rope_theta"] == 1e6


def test_which_sections_allow_extra_keys():
    import mf_config

    extra = sorted(name for name in mf_config.__all__
                   if isinstance(getattr(mf_config, name), type) and issubclass(getattr(mf_config, name), Section)
                   and getattr(mf_config, name).allow_extra)
    assert extra == ["CallbackConfig", "DataloaderConfig", "ExtraSection", "LrSchedulerConfig", "ModelConfig",
                     "OptimizerConfig"]
    assert all(issubclass(getattr(mf_config, n), ExtraSection) for n in extra)


STRICT = ["checkpoint", "training", "parallelism", "train_dataset", "monitor", "monitor.train_state",
          "monitor.moe_monitor", "profiler", "recompute", "recompute_comm", "swap", "context", "tokenizer",
          "inference", "lora", "eval_dataset"]


@pytest.mark.parametrize("section", STRICT)
def test_strict_sections_reject_unknown_keys(load_text, section):
    parts = section.split(".")
    body = {"lora": "  target_modules: q\n", "eval_dataset": "  dataloader:\n    type: X\n"}.get(parts[0], "")
    if len(parts) == 1:
        fragment = f"{section}:\n{body}  bogus_key: 1\n"
    else:
        fragment = f"{parts[0]}:\n  {parts[1]}:\n    bogus_key: 1\n"
    with pytest.raises(ConfigError, match=rf"^{section}\.bogus_key: unknown key \(known: "):
        load_text(fragment)


def test_unknown_top_level_section_is_rejected(load_text):
    with pytest.raises(ConfigError, match=r"^moe_config: unknown top-level section"):
        load_text("moe_config:\n  expert_num: 8\n")


def test_pass_through_values_must_be_plain_data():
    with pytest.raises(ConfigError, match=r"^model.builder: is not plain YAML data"):
        load_config({"model": {"model_type": "x", "builder": object()}, "training": {},
                     "train_dataset": {"dataloader": {"type": "X"}}})


# ----------------------------------------------------------------------------- types

def test_float_fields_take_ints_and_numeric_strings(load_text):
    cfg = load_text("training:\n  max_norm: 2\nlr_scheduler:\n  learning_rate: '1e-4'\n"
                    "optimizer:\n  eps: 1e-6\n  weight_decay: 1.e-2\n")
    assert cfg.training.max_norm == 2.0 and isinstance(cfg.training.max_norm, float)
    assert cfg.lr_scheduler.learning_rate == 1e-4
    assert cfg.optimizer.eps == 1e-6 and cfg.optimizer.weight_decay == 0.01


def test_exponent_floats_are_numbers_in_pass_through_keys_too(load_text):
    # Plain PyYAML would hand the model the string "1e-6".
    cfg = load_text("model:\n  model_type: x\n  rms_norm_eps: 1e-6\n  name: '1e-6'\n")
    assert cfg.model.extra["rms_norm_eps"] == 1e-6
    assert cfg.model.extra["name"] == "1e-6"


@pytest.mark.parametrize(("value", "expected"), [(0, 0), (1, 1), ("graph", 0), ("pynative", 1), ("PyNative", 1)])
def test_context_mode_spellings(build, value, expected):
    assert build(context={"mode": value}).context.mode == expected


@pytest.mark.parametrize("target", ["CPU", "Ascend", "GPU", None])
def test_context_device_targets(build, target):
    assert build(context={"device_target": target}).context.device_target == target


def test_bool_is_not_an_int_and_int_is_not_a_bool(build):
    with pytest.raises(ConfigError, match=r"^context.mode: expected an integer, got True \(bool\)$"):
        build(context={"mode": True})
    with pytest.raises(ConfigError, match=r"^checkpoint.async_save: expected a boolean \(True/False\), got 0 \(int\)$"):
        build(checkpoint={"async_save": 0})


# ----------------------------------------------------------------------------- resolved defaults

def test_default_save_path_is_under_output_dir(build):
    assert build().checkpoint.save_path == "./output/checkpoint"
    assert build(output_dir="/runs/a").checkpoint.save_path == "/runs/a/checkpoint"
    assert build(checkpoint={"save_path": "/ckpt"}).checkpoint.save_path == "/ckpt"


def test_sections_are_plain_dataclasses():
    cfg = TrainConfig()
    assert dataclasses.is_dataclass(cfg)
    assert cfg == TrainConfig() and cfg != dataclasses.replace(cfg, run_mode="eval")
