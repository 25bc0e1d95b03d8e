"""A decoder layer's module names, mf's and MindFormers', from the arguments and on the built layer."""

from __future__ import annotations

import pytest

import mf_models

DENSE = ("attention_norm", "attention", "ffn_norm", "feed_forward")
ROUTED = ("attention_norm", "attention", "ffn_norm", "moe")


@pytest.mark.parametrize("path, modules, want", [
    ("attention", DENSE, "attention"), ("self_attention", DENSE, "attention"),
    ("mlp", DENSE, "feed_forward"), ("mlp", ROUTED, "moe"),
    ("feed_forward", DENSE, "feed_forward"), ("feed_forward", ROUTED, "moe"),   # MindFormers' MLP of any layer
    ("moe", ROUTED, "moe"), ("moe", DENSE, None),                                # mf's moe: routed layers only
    ("input_layernorm", DENSE, "attention_norm"), ("pre_mlp_layernorm", ROUTED, "ffn_norm"),
    ("mlp.w1", DENSE, "feed_forward.w1"), ("self_attention.wq", DENSE, "attention.wq"),
    ("attention_norm", DENSE, "attention_norm"), ("mlpx", DENSE, None), ("", DENSE, None),
    ("self_attn", DENSE, "attention"), ("post_attention_layernorm", ROUTED, "ffn_norm"),     # transformers'
])
def test_both_spellings_name_the_same_module(path, modules, want):
    assert mf_models.module_in_layer(path, modules) == want


def test_layer_modules_follow_the_model_layers():
    _, dsv3 = mf_models.build_args(mf_models.tiny_model_section("deepseek_v3"))     # first_k_dense_replace 1
    assert [mf_models.layer_modules(dsv3, i) for i in (0, 1)] == [DENSE, ROUTED]
    _, llama = mf_models.build_args(mf_models.tiny_model_section("llama"))
    assert mf_models.layer_modules(llama, 1) == DENSE


@pytest.mark.parametrize("model_type", ["llama", "deepseek_v3", "qwen3_moe"])
def test_the_built_layers_have_the_modules_the_arguments_name(model_type):
    model = mf_models.build_model(mf_models.tiny_model_section(model_type), init=False)
    for i, layer in enumerate(model.layers):
        assert tuple(layer.name_cells()) == mf_models.layer_modules(model.args, i)
        assert mf_models.resolve_layer_module(layer, "mlp", "k") is getattr(layer, mf_models.layer_modules(model.args, i)[3])


def test_resolving_on_the_built_layer():
    model = mf_models.build_model(mf_models.tiny_model_section("llama"), init=False)
    layer = model.layers[0]
    assert mf_models.resolve_layer_module(layer, "self_attention.wq", "k") is layer.attention.wq
    with pytest.raises(mf_models.ModelConfigError, match=r"^swap.op_swap\[0\].op_name: the layer has no module "
                                                         r"'moe'; its modules are: attention_norm, attention, "
                                                         r"ffn_norm, feed_forward \(or MindFormers' names for them: "):
        mf_models.resolve_layer_module(layer, "moe", "swap.op_swap[0].op_name")
    with pytest.raises(mf_models.ModelConfigError, match=r"^k: 'mlp.w9' is not a module of the layer; FeedForward "
                                                         r"holds: w1, w2, w3$"):
        mf_models.resolve_layer_module(layer, "mlp.w9", "k")
