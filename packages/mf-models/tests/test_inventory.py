"""parameter_inventory against the models build_model makes and the tensor-parallel plans they carry."""

from __future__ import annotations

import pytest

import mf_models
import mf_parallel as mp
from mf_models.llama.parallelize import tp_plan
from mf_models.qwen3.parallelize import qwen3_block_plan

CASES = [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
    ("qwen2", {}),
    ("qwen3", {"tie_word_embeddings": True}),
]


def _plan(model, model_type):
    return tp_plan(model, qwen3_block_plan if model_type == "qwen3" else None)


@pytest.mark.parametrize(("model_type", "changes"), CASES)
def test_inventory_is_what_build_model_makes(model_type, changes):
    section = mf_models.tiny_model_section(model_type, **changes)
    model = mf_models.build_model(section, init=False)
    _, args = mf_models.build_args(section)
    built = [(name, tuple(p.shape)) for name, p in model.parameters_and_names()]
    assert [(e.name, e.shape) for e in mf_models.parameter_inventory(args)] == built


@pytest.mark.parametrize(("model_type", "changes"), CASES)
def test_tp_axes_are_the_plans(model_type, changes):
    """Each axis is the one the model's own plan reslices: Colwise rows (weight and bias),
    Rowwise columns (bias replicated), vocabulary rows of the embedding; the rest replicated."""
    section = mf_models.tiny_model_section(model_type, **changes)
    model = mf_models.build_model(section, init=False)
    _, args = mf_models.build_args(section)
    plan = _plan(model, model_type)
    for e in mf_models.parameter_inventory(args):
        leaf, _, pname = e.name.rpartition(".")
        style = plan.get(leaf)
        if e.name == "tok_embeddings.weight":
            assert isinstance(style, mp.VocabParallelEmbedding) and e.tp_axis == 0
        elif isinstance(style, mp.ColwiseParallel):
            assert e.tp_axis == 0, e.name
        elif isinstance(style, mp.RowwiseParallel):
            assert e.tp_axis == (1 if pname == "weight" else None), e.name
        else:
            assert e.tp_axis is None, (e.name, style)


def test_moe_and_latent_models_are_refused_with_the_type():
    _, args = mf_models.build_args(mf_models.tiny_model_section("deepseek_v3"))
    with pytest.raises(mf_models.ModelConfigError, match="deepseek_v3.*not tabulated"):
        mf_models.parameter_inventory(args)
    with pytest.raises(mf_models.ModelConfigError, match="deepseek_v3"):
        mf_models.saved_activations(args, 16)


def test_saved_activations_split_under_tensor_parallelism():
    _, args = mf_models.build_args(mf_models.tiny_model_section("llama"))
    one, two = mf_models.saved_activations(args, 16), mf_models.saved_activations(args, 16, 2)
    assert two["feed_forward"] * 2 == one["feed_forward"] == 4 * 16 * args.intermediate_size
    # the scores: heads x seq x seq three times, half the heads per rank
    assert one["attention"] - two["attention"] >= 3 * 2 * 16 * 16
    fused = mf_models.saved_activations(args, 16, fused_attention=True)
    assert one["attention"] - fused["attention"] == args.num_attention_heads * 16 * (3 * 16 - 2)
