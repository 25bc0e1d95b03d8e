"""recompute_comm's plan rewrite: which gathers move into the projections, and what is refused.
(The numbers it trains to are tests-integration/dist: tp2_rcomm against one process.)"""

from __future__ import annotations

import pytest

import mf_models
import mf_parallel as mp
from mf_models.common.recompute_comm import apply_recompute_comm
from mf_models.deepseek_v3.parallelize import deepseek_block_plan
from mf_models.llama.parallelize import tp_plan
from mf_models.qwen3.parallelize import qwen3_block_plan


def _model(model_type, **changes):
    return mf_models.build_model(mf_models.tiny_model_section(model_type, **changes), init=False)


@pytest.mark.parametrize(("model_type", "block_plan"), [("llama", None), ("qwen3", qwen3_block_plan)])
def test_selected_gathers_move_into_the_projections(model_type, block_plan):
    model = _model(model_type)
    plan = tp_plan(model, block_plan)
    got = apply_recompute_comm(plan, model, {0: frozenset({"attention"}), 1: frozenset({"feed_forward"})})
    assert "layers.0.attention" not in got and "layers.1.feed_forward" not in got
    for path in ("layers.0.attention.wq", "layers.0.attention.wk", "layers.0.attention.wv",
                 "layers.1.feed_forward.w1", "layers.1.feed_forward.w3"):
        assert got[path].input_layout == "shard_seq" and got[path].regather_input, path
    # unselected modules keep their one gather; the row-parallel projections are untouched
    assert isinstance(got["layers.1.attention"], mp.PrepareModuleInput)
    assert isinstance(got["layers.0.feed_forward"], mp.PrepareModuleInput)
    assert got["layers.1.attention.wq"].input_layout == "gathered" and not got["layers.1.attention.wq"].regather_input
    assert got["layers.0.attention.wo"] is plan["layers.0.attention.wo"]
    assert list(got) == [p for p in plan if p in got]                 # the plan's order is kept


def test_names_select_the_gathers():
    assert {mf_models.recompute_comm_module(k, "x") for k in ("attention", "attention.qkv", "attention_norm")} == \
        {"attention"}
    assert {mf_models.recompute_comm_module(k, "x") for k in ("feed_forward", "ffn_norm")} == {"feed_forward"}
    with pytest.raises(mf_models.ModelConfigError, match=r"^k: 'attention.wo' names no sequence-parallel all-gather"):
        mf_models.recompute_comm_module("attention.wo", "k")


def test_moe_layers_and_mla_are_refused():
    model = _model("deepseek_v3")
    plan = tp_plan(model, deepseek_block_plan)
    with pytest.raises(mf_models.ModelConfigError, match="layer 0 attention: not implemented for Attention"):
        apply_recompute_comm(plan, model, {0: frozenset({"attention"})})
    moe_layer = next(i for i, layer in enumerate(model.layers) if getattr(layer, "moe_enabled", False))
    with pytest.raises(mf_models.ModelConfigError, match=f"layer {moe_layer} feed_forward: this layer has no"):
        apply_recompute_comm(plan, model, {moe_layer: frozenset({"feed_forward"})})
