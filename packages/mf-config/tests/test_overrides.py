"""`--set KEY=VALUE` overrides: YAML-typed values, list indices, created parents, one-line errors."""

from __future__ import annotations

import pytest

from mf_config import ConfigError, apply_overrides, load_config

from_seed = {"model": {"model_type": "qwen3", "num_hidden_layers": 8, "num_attention_heads": 8},
             "train_dataset": {"dataloader": {"type": "X"}}, "training": {"steps": 100}}


def _load(*sets: str):
    return load_config(from_seed, overrides=sets)


def test_values_are_yaml_typed():
    cfg = _load("training.steps=20", "optimizer.betas=[0.9,0.99]", "lr_scheduler.learning_rate=1e-4",
                "training.deterministic=true", "optimizer.weight_decay_exclude=[bias, norm]",
                "profiler.output_path=null")
    assert cfg.training.steps == 20
    assert cfg.optimizer.betas == [0.9, 0.99]
    assert cfg.lr_scheduler.learning_rate == 1e-4
    assert cfg.training.deterministic is True
    assert cfg.optimizer.weight_decay_exclude == ["bias", "norm"]
    assert cfg.profiler.output_path is None


def test_later_overrides_win_and_empty_value_is_the_empty_string():
    cfg = _load("training.steps=20", "training.steps=30", "checkpoint.load_path=", "checkpoint.prefix = run1")
    assert cfg.training.steps == 30 and cfg.checkpoint.load_path == "" and cfg.checkpoint.prefix == "run1"


def test_list_indices_both_spellings_and_append():
    cfg = _load("callbacks[0].type=A", "callbacks.1.type=B", "callbacks[1].every=3")
    assert [c.type for c in cfg.callbacks] == ["A", "B"]
    assert cfg.callbacks[1].extra == {"every": 3}
    cfg = _load("swap.enable=true", "swap.layer_swap[0].layers=['0-1']", "swap.layer_swap.0.layers[1]='3'")
    assert cfg.swap.layer_swap[0].layers == ["0-1", "3"]


def test_missing_parents_are_created():
    cfg = _load("lora.target_modules=attention", "monitor.moe_monitor.target_layers=[0, 1]")
    assert cfg.lora.target_modules == "attention"
    assert cfg.monitor.moe_monitor.target_layers == [0, 1]


def test_quoted_keys_may_hold_dots():
    cfg = _load("recompute_comm.enable=true", "recompute_comm.select_module['attention.qkv']=['0-3']",
                'recompute_comm.select_module["mlp.w1"]=[\'4\']')
    assert cfg.recompute_comm.select_module == {"attention.qkv": ["0-3"], "mlp.w1": ["4"]}


def test_overrides_are_validated_like_the_file():
    with pytest.raises(ConfigError, match=r"^training.stpes: unknown key; did you mean 'steps'\?$"):
        _load("training.stpes=20")
    with pytest.raises(ConfigError, match=r"^training.steps: expected an integer, got 'many' \(str\)$"):
        _load("training.steps=many")


def test_an_override_can_supply_a_whole_config(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    cfg = load_config(path, overrides=["model.model_type=llama", "train_dataset.dataloader.type=X", "training={}"])
    assert cfg.model.model_type == "llama"


def test_the_callers_mapping_is_not_modified():
    raw = {"model": {"model_type": "x"}, "train_dataset": {"dataloader": {"type": "X"}}, "training": {"steps": 5}}
    load_config(raw, overrides=["training.steps=6"])
    assert raw["training"] == {"steps": 5}


def test_a_single_string_is_one_override():
    assert _load().training.steps == 100
    assert load_config(from_seed, overrides="training.steps=7").training.steps == 7


def test_apply_overrides_on_raw_data():
    assert apply_overrides({"a": {"b": [1, 2]}}, ["a.b[1]=5", "a.c.d=x"]) == {"a": {"b": [1, 5], "c": {"d": "x"}}}


MALFORMED = [
    ("training.steps", "expected KEY=VALUE"),
    ("=5", "the key is empty"),
    ("training..steps=5", "empty key name"),
    ("training.=5", "empty key name"),
    ("[0].type=X", "top level is a mapping"),
    ("0.type=X", "top level is a mapping"),
    ("callbacks[x].type=X", "brackets hold a list index or a quoted key"),
    ("callbacks[0.type=X", "brackets hold"),
    ("callbacks[0]type=X", "expected '.' or '['"),
    ("callbacks[5].type=X", "callbacks has 0 item(s): index 5 is out of range (use 0 to append)"),
    ("callbacks.type=X", "callbacks is a list: address its items by index"),
    ("training.steps.max=3", "training.steps is 100, not a mapping or list, so it has no key 'max'"),
    ("optimizer.betas=[0.9, 0.99", "invalid YAML"),
    ("training.steps=a: b: c", "invalid YAML"),
]


@pytest.mark.parametrize(("override", "text"), MALFORMED)
def test_malformed_overrides_are_one_line_errors(override, text):
    with pytest.raises(ConfigError) as info:
        _load("callbacks=[]", override) if override.startswith("callbacks") else _load(override)
    message = str(info.value)
    assert message.startswith(f"--set {override}: "), message
    assert text in message, message
    assert "\n" not in message
