"""parameter_inventory against the models build_model makes and the tensor-parallel plans they carry."""

from __future__ import annotations

import pytest

import mf_models
import mf_parallel as mp
from mf_models.deepseek_v3.parallelize import deepseek_block_plan
from mf_models.glm4.parallelize import glm4_block_plan
from mf_models.glm4_moe.parallelize import glm4_moe_block_plan
from mf_models.gpt2.parallelize import gpt2_block_plan
from mf_models.llama.parallelize import tp_plan
from mf_models.qwen3.parallelize import qwen3_block_plan

# Every registered model with an inventory in its tiny preset, and the variants that change its tables.
CASES = [(t, {}) for t in mf_models.available_models() if mf_models.resolve_spec(t).inventory is not None] + [
    ("llama", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
    ("qwen3", {"tie_word_embeddings": True}),
    ("deepseek_v3", {"q_lora_rank": None, "first_k_dense_replace": 0, "n_shared_experts": 2}),
    ("gpt2", {"tie_word_embeddings": False}),
    ("glm4_moe", {"use_qk_norm": False, "attention_bias": False, "n_shared_experts": 0}),
]
BLOCK_PLANS = {"qwen3": qwen3_block_plan, "qwen3_moe": qwen3_block_plan, "deepseek_v3": deepseek_block_plan,
               "gpt2": gpt2_block_plan, "glm4": glm4_block_plan, "glm4_moe": glm4_moe_block_plan}
EXTRA_PLANS = {"gpt2": {"pos_embeddings": mp.VocabParallelEmbedding()}}    # gpt2/parallelize.py


def _plan(model, model_type):
    return tp_plan(model, BLOCK_PLANS.get(model_type), EXTRA_PLANS.get(model_type))


@pytest.mark.parametrize(("model_type", "changes"), CASES)
def test_inventory_is_what_build_model_makes(model_type, changes):
    section = mf_models.tiny_model_section(model_type, **changes)
    model = mf_models.build_model(section, init=False)
    _, args = mf_models.build_args(section)
    built = [(name, tuple(p.shape), p.requires_grad) for name, p in model.parameters_and_names()]
    inventory = mf_models.parameter_inventory(args)
    assert [(e.name, e.shape, e.trainable) for e in inventory] == built
    assert sum(e.numel for e in inventory) == sum(p.size for p in model.get_parameters())


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
        if e.name in ("tok_embeddings.weight", "pos_embeddings.weight"):
            assert isinstance(style, mp.VocabParallelEmbedding) and e.tp_axis == 0
        elif isinstance(style, mp.ColwiseParallel):
            assert e.tp_axis == 0, e.name
        elif isinstance(style, mp.RowwiseParallel):
            assert e.tp_axis == (1 if pname == "weight" else None), e.name
        else:
            assert e.tp_axis is None, (e.name, style)


def test_full_size_deepseek_v3_has_its_published_parameter_count():
    """The examples/ preset's shape (DeepSeek-V3: 61 layers, 3 dense, 256 routed + 1 shared expert,
    MLA): 671B parameters without the multi-token-prediction module (DeepSeek's report: 671B total,
    37B activated; HF's checkpoint adds the 14B MTP layer), computed without building anything."""
    section = {"model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
               "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
               "num_key_value_heads": 128, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8,
               "topk_group": 4, "n_shared_experts": 1, "first_k_dense_replace": 3, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "max_position_embeddings": 4096}
    _, args = mf_models.build_args(section)
    total = sum(e.numel for e in mf_models.parameter_inventory(args))
    assert 671.0e9 <= total < 671.1e9, total


def test_moe_activations_follow_the_dispatcher_blocks():
    """The rows and weight blocks are the dispatcher's static bounds (common/blocks.py, what
    LocalDispatcher allocates): for the tiny DeepSeek-V3 on 32 tokens, N = 64 assignments over 4
    experts, blocks of 4 rows, at most 19 blocks (76 rows)."""
    _, args = mf_models.build_args(mf_models.tiny_model_section("deepseek_v3"))
    terms = mf_models.moe_activations(args, 32)
    assert (terms["rows_per_block"], terms["blocks"]) == (4, 19)
    h, f = args.hidden_size, args.moe_intermediate_size
    assert terms["gathered_weights"] == 19 * 3 * f * h and terms["swiglu"] == 4 * 76 * f
    assert terms["shared_experts"] == 4 * 32 * f * args.n_shared_experts
    layers = [mf_models.saved_activations(args, 32, layer=i) for i in range(2)]
    assert "feed_forward" in layers[0] and layers[1]["moe"] == terms["total"]     # first_k_dense_replace 1
    # under tp the MoE runs on the rank's sequence shard
    assert mf_models.saved_activations(args, 32, 2, layer=1)["moe"] == mf_models.moe_activations(args, 16)["total"]


def test_moe_activations_under_expert_parallelism_are_the_all_to_all_buffers():
    """EP2 on 32 tokens: the local experts (2 + the null one, top-1) run on the 2 x 64 received
    slots, sized as the dispatcher the EP plan builds (LocalDispatcher(E / ep + 1, 1)) sizes them;
    the router stays on the rank's own 32 tokens."""
    from mf_models.common.dispatch import LocalDispatcher

    _, args = mf_models.build_args(mf_models.tiny_model_section("deepseek_v3"))
    one, ep2 = mf_models.moe_activations(args, 32), mf_models.moe_activations(args, 32, 2)
    b, blocks = LocalDispatcher(args.n_routed_experts // 2 + 1, 1).layout_sizes(2 * 32 * args.num_experts_per_tok)
    assert (ep2["rows_per_block"], ep2["blocks"]) == (b, blocks) == (11, 14)
    h, f, n = args.hidden_size, args.moe_intermediate_size, 32 * args.num_experts_per_tok
    assert ep2["router"] == one["router"] and ep2["rows"] == blocks * b * h and ep2["swiglu"] == 4 * blocks * b * f
    assert ep2["combine"] == (2 * n + 2 * n) * h        # [P, N, H] back + the [N, H] sent + the weighted rows
    assert ep2["total"] > one["total"]


def test_saved_activations_split_under_tensor_parallelism():
    _, args = mf_models.build_args(mf_models.tiny_model_section("llama"))
    one, two = mf_models.saved_activations(args, 16), mf_models.saved_activations(args, 16, 2)
    assert two["feed_forward"] * 2 == one["feed_forward"] == 4 * 16 * args.intermediate_size
    # the scores: heads x seq x seq three times, half the heads per rank
    assert one["attention"] - two["attention"] >= 3 * 2 * 16 * 16
    fused = mf_models.saved_activations(args, 16, fused_attention=True)
    assert one["attention"] - fused["attention"] == args.num_attention_heads * 16 * (3 * 16 - 2)
