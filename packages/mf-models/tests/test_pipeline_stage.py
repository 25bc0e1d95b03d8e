"""`pipeline_stage`: a CausalLM cut into the chunks of one pipeline rank. Global parameter names,
each decoder parameter on exactly one rank, the tied table on both ends (or once, where one rank
holds both), and, run by mf-parallel's executor in one process (one rank holding two chunks,
split backward), the loss and gradients of the whole model under MindSpore's autodiff."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, ops

import mf_models
import mf_parallel as mp
from mf_parallel.mesh import make_group
from mf_parallel.pipeline import PipelineSpec

CFG = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32, "attention_bias": True}


@pytest.fixture(autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE, pynative_synchronize=True)
    yield


@pytest.mark.parametrize("schedule, layers", [("1f1b", [[0, 1], [2, 3]]), ("zbv", [[0], [1], [2], [3]])])
@pytest.mark.parametrize("tied", [True, False])
def test_stages_partition_the_model_under_global_names(schedule, layers, tied):
    cfg = {**CFG, "tie_word_embeddings": tied}
    full = {n for n, _ in mf_models.build_model(cfg, seed=0).parameters_and_names()}
    layout = mp.StageLayout.build(mp.resolve_pipeline(2, schedule), layers)
    names = []
    for rank in range(2):
        stage = mf_models.pipeline_stage(mf_models.build_model(cfg, seed=0), layout, rank)
        names.append({n for n, _ in stage.parameters_and_names()})
        assert {p.name for c in stage.chunks for p in c.trainable_params()} == names[-1]
        assert len(stage.tied) == (1 if tied and schedule == "1f1b" else 0)
    assert names[0] | names[1] == full
    shared = names[0] & names[1]
    assert shared == ({"tok_embeddings.weight"} if tied and schedule == "1f1b" else set())


def test_uneven_layers_per_stage_and_the_tied_ends_on_four_ranks():
    layout = mp.StageLayout.build(mp.resolve_pipeline(4), [[0], [1, 2], [3, 4], [5]])
    cfg = {**CFG, "num_hidden_layers": 6, "tie_word_embeddings": True}
    stages = [mf_models.pipeline_stage(mf_models.build_model(cfg, seed=0), layout, r) for r in range(4)]
    layers = [sorted({n.split(".")[1] for n, _ in s.parameters_and_names() if n.startswith("layers.")})
              for s in stages]
    assert layers == [["0"], ["1", "2"], ["3", "4"], ["5"]]
    assert [len(s.tied) for s in stages] == [1, 0, 0, 1]


def test_a_plans_output_leaf_sharing_the_table_stays_tied_across_the_ends():
    """Under TP or FSDP the plan gives a tied model an `output` leaf whose weight IS the table
    (`untie_output`); the last stage keeps that leaf, still named tok_embeddings.weight and tied
    to the first stage's table. With sequence parallelism the activations are sequence shards."""
    from mf_models.common.parallel import untie_output

    layout = mp.StageLayout.build(mp.resolve_pipeline(2), [[0, 1], [2, 3]])
    stages = []
    for rank in range(2):
        model = mf_models.build_model({**CFG, "tie_word_embeddings": True}, seed=0)
        untie_output(model)
        stages.append(mf_models.pipeline_stage(model, layout, rank, sequence_shards=2))
    first, last = stages
    assert first.tied == (first.tok_embeddings.weight,) and last.tied == (last.output.weight,)
    assert last.output.weight.name == "tok_embeddings.weight" and not hasattr(last, "tok_embeddings")
    np.testing.assert_array_equal(last.output.weight.asnumpy(), first.tok_embeddings.weight.asnumpy())
    mb = {"input_ids": Tensor(np.zeros((2, 8), np.int32))}
    assert first.chunks[0].output_spec(mb)[0] == (2, 4, 32) and last.chunks[0].input_spec(mb)[0] == (2, 4, 32)


def test_the_last_stages_table_copy_starts_equal():
    layout = mp.StageLayout.build(mp.resolve_pipeline(2), [[0, 1], [2, 3]])
    model = mf_models.build_model({**CFG, "tie_word_embeddings": True}, seed=0)
    last = mf_models.pipeline_stage(model, layout, 1)
    assert last.tok_embeddings.weight is not model.tok_embeddings.weight
    np.testing.assert_array_equal(last.tok_embeddings.weight.asnumpy(), model.tok_embeddings.weight.asnumpy())


def test_layer_count_must_match():
    layout = mp.StageLayout.build(mp.resolve_pipeline(2), [[0], [1]])
    with pytest.raises(mf_models.ModelConfigError, match="places 2 layers, model.num_hidden_layers is 4"):
        mf_models.pipeline_stage(mf_models.build_model(CFG, seed=0), layout, 0)


def _mbs(m):
    rng = np.random.default_rng(0)
    return [{"input_ids": Tensor(rng.integers(0, 64, (2, 8)).astype(np.int32)),
             "labels": Tensor(rng.integers(0, 64, (2, 8)).astype(np.int32)),
             "loss_mask": Tensor((rng.random((2, 8)) > 0.2).astype(np.float32))} for _ in range(m)]


_LS = ops.LogSoftmax(-1)


def _loss(logits, mb):
    per_token = -ops.gather_elements(_LS(logits.reshape(-1, 64)), 1, mb["labels"].reshape(-1, 1)).reshape(-1)
    return (per_token * mb["loss_mask"].reshape(-1)).sum() / 100.0


@pytest.mark.parametrize("split", [False, True])
def test_executor_on_the_chunks_matches_the_whole_model(split):
    cfg = {**CFG, "tie_word_embeddings": True}
    mbs = _mbs(3)
    ref_model = mf_models.build_model(cfg, seed=0)
    params = ref_model.trainable_params()
    ref_loss, ref = 0.0, {p.name: 0.0 for p in params}
    for mb in mbs:
        out, vjp_fn = ms.vjp(lambda mb=mb: _loss(ref_model(mb["input_ids"]), mb), weights=params)
        ref_loss += float(out.asnumpy())
        for p, g in zip(params, vjp_fn(ops.ones_like(out))[1]):
            ref[p.name] = ref[p.name] + g.asnumpy()
    spec = PipelineSpec(1, "interleaved_1f1b", 2, split_backward=split)
    layout = mp.StageLayout.build(spec, [[0, 1], [2, 3]])
    stage = mf_models.pipeline_stage(mf_models.build_model(cfg, seed=0), layout, 0)
    executor = mp.PipelineExecutor(mp.build_schedule(spec, 3), stage.chunks, make_group("pp", [0]))
    assert len(executor.deferred) == (28 if split else 0)           # the 7 Linears of each of the 4 blocks
    result = executor.step(mbs, _loss)
    assert result.loss == pytest.approx(ref_loss, rel=1e-6)
    assert sorted(p.name for p in executor.params) == sorted(ref)
    for p, g in zip(executor.params, result.grads):
        scale = float(np.max(np.abs(ref[p.name])))
        assert float(np.max(np.abs(g.asnumpy() - ref[p.name]))) <= 1e-5 * scale, p.name


# A tiny DeepSeek-V3 of 3 layers: dense layer 0, MoE layers 1 and 2 (sequence-wise balance loss).
MOE_CFG = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
           "max_position_embeddings": 32, "moe_intermediate_size": 16, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "n_group": 2, "topk_group": 2, "n_shared_experts": 1,
           "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8,
           "qk_rope_head_dim": 4, "v_head_dim": 8, "aux_loss_alpha": 0.1, "seq_aux": True}


@pytest.mark.parametrize("split, alpha", [(False, 0.1), (True, 0.1), (False, 0.0)])
def test_moe_chunks_add_their_balance_loss_and_routing_counts(split, alpha):
    """A MoE model's chunks (dense + MoE layer on the first, MoE layer on the last) run by the
    executor give the whole model's objective (LM loss + weighted balance loss), its gradients and
    its routing counts: each chunk's balance loss is differentiated in its own backward. Without a
    balance loss (alpha 0) the side loss is a constant 0 and the counts still add up."""
    cfg = {**MOE_CFG, "aux_loss_alpha": alpha}
    weight = 0.5
    mbs = _mbs(3)
    ref_model = mf_models.build_model(cfg, seed=0)
    params = ref_model.trainable_params()
    ref_loss, ref_aux, ref_load, ref = 0.0, 0.0, 0.0, {p.name: 0.0 for p in params}
    for mb in mbs:
        def objective(mb=mb):
            logits, aux, load, counts = ref_model.forward_train(mb["input_ids"])
            return _loss(logits, mb) + aux * weight, aux * weight, load
        (out, aux, load), vjp_fn = ms.vjp(objective, weights=params)
        ref_loss += float(out.asnumpy())
        ref_aux += float(aux.asnumpy())
        ref_load = ref_load + load.asnumpy()
        grads = vjp_fn((ops.ones_like(out), ops.zeros_like(aux), ops.zeros_like(load)))[1]
        for p, g in zip(params, grads):
            ref[p.name] = ref[p.name] + g.asnumpy()
    assert (ref_aux > 0) == (alpha > 0)
    spec = PipelineSpec(1, "interleaved_1f1b", 2, split_backward=split)
    layout = mp.StageLayout.build(spec, [[0, 1], [2]])
    stage = mf_models.pipeline_stage(mf_models.build_model(cfg, seed=0), layout, 0)
    stage.train_routing(weight)
    assert [c.moe_rows for c in stage.chunks] == [(0,), (1,)] and all(c.side_outputs for c in stage.chunks)
    executor = mp.PipelineExecutor(mp.build_schedule(spec, 3), stage.chunks, make_group("pp", [0]))
    result = executor.step(mbs, _loss)
    assert result.loss == pytest.approx(ref_loss, rel=1e-6)
    assert result.side_loss == pytest.approx(ref_aux, rel=1e-6, abs=0 if alpha else 1e-12)
    load = np.concatenate([stats[0].asnumpy() for stats in result.stats])
    np.testing.assert_array_equal(load, ref_load)
    assert sorted(p.name for p in executor.params) == sorted(ref)
    for p, g in zip(executor.params, result.grads):
        scale = float(np.max(np.abs(ref[p.name])))
        assert float(np.max(np.abs(g.asnumpy() - ref[p.name]))) <= 1e-5 * scale, p.name
    # The gate's gradient comes from the balance loss (and the selection's weights): not zero.
    gate = [g for p, g in zip(executor.params, result.grads) if p.name == "layers.1.moe.router.gate.weight"]
    assert gate and float(np.abs(gate[0].asnumpy()).max()) > 0


def test_switch_balance_loss_does_not_split_into_stages():
    cfg = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 32,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
           "output_router_logits": True, "router_aux_loss_coef": 0.01}
    layout = mp.StageLayout.build(mp.resolve_pipeline(2), [[0], [1]])
    with pytest.raises(mf_models.ModelConfigError, match="switch balance loss"):
        mf_models.pipeline_stage(mf_models.build_model(cfg, seed=0), layout, 0)
