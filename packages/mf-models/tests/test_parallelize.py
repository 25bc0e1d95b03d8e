"""The per-model parallel plans on one process.

What one process can check: (1) every leaf's parameter forward, FSDP's rewrite and the tied-output
leaf compute exactly what the plain model computes (a one-rank mesh makes every collective the
identity), in PyNative and GRAPH_MODE; (2) each tensor-parallel rank keeps the right slice of
every weight (on a stand-in two-rank group: construction only, nothing is communicated);
(3) bad layouts are one clear line and leave the model untouched. Loss parity on real ranks is
proven in tests-integration/dist.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor

import mf_models
import mf_parallel as mp
from mf_models.common.parallel import apply_fsdp, moe_units, untie_output
from mf_parallel.mesh import Group

IDS = Tensor(np.random.default_rng(0).integers(0, 64, (2, 8)).astype(np.int32))

CASES = {
    "llama-tied-bias": ("llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "qwen3": ("qwen3", {}),
    "deepseek_v3": ("deepseek_v3", {}),
    "deepseek_v3-no-q-lora": ("deepseek_v3", dict(q_lora_rank=None)),
    "qwen2": ("qwen2", {}),
    "mixtral": ("mixtral", {}),
    "qwen3_moe": ("qwen3_moe", {}),
}


def loss_and_grads(model):
    def loss(ids):
        return (model(ids) ** 2).mean()

    value, grads = ms.value_and_grad(loss, None, model.trainable_params())(IDS)
    return float(value.asnumpy()), [g.asnumpy() for g in grads]


@pytest.fixture(scope="module")
def mesh1():
    return mp.init_mesh(mp.ParallelDims(1))


def _fsdp_one_rank(model, mesh, policy):
    untie_output(model)
    units = moe_units if model.moe_layer_ids() else None
    apply_fsdp(model, mesh, mp.Layout.for_dims(mesh.dims, {"reshard_after_forward_policy": policy}), units)


def _compare(section, mesh, policy):
    want_loss, want_grads = loss_and_grads(mf_models.build_model(section, seed=1))
    plain = mf_models.build_model(section, seed=1)
    names = [n for n, _ in plain.parameters_and_names()]
    trained = [p.name for p in plain.trainable_params()]
    _fsdp_one_rank(plain, mesh, policy)
    assert [n for n, _ in plain.parameters_and_names()] == names          # checkpoints keep their names
    assert [p.name for p in plain.trainable_params()] == trained          # and so do optimizer states
    got_loss, got_grads = loss_and_grads(plain)
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    for name, got, want in zip(trained, got_grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("policy", ["always", "never"])
@pytest.mark.parametrize("case", list(CASES))
def test_fsdp_rewrite_matches_the_plain_model(mesh1, case, policy):
    model_type, extra = CASES[case]
    _compare(mf_models.tiny_model_section(model_type, **extra), mesh1, policy)


def test_fsdp_rewrite_matches_the_plain_model_compiled(mesh1, graph_mode):
    # One compile pair (the tied llama: shared table, recomputing backward); the plans compile on
    # real ranks in the dist tests.
    _compare(mf_models.tiny_model_section("llama", tie_word_embeddings=True), mesh1, "always")


def test_untie_output_shares_the_table():
    model = mf_models.build_model(mf_models.tiny_model_section("llama", tie_word_embeddings=True), seed=2)
    before = model(IDS).asnumpy()
    flops = model.num_flops_per_token(8)
    untie_output(model)
    assert model.output.weight is model.tok_embeddings.weight
    assert model.tok_embeddings.weight.name == "tok_embeddings.weight"
    assert [n for n, _ in model.parameters_and_names()].count("tok_embeddings.weight") == 1
    assert "output.weight" not in mf_models.model_state(model)
    np.testing.assert_array_equal(model(IDS).asnumpy(), before)
    assert model.num_flops_per_token(8) == flops


# ----------------------------------------------------------------------------- TP slices
class _Mesh:
    def __init__(self, dims, tp_group):
        self.dims, self.tp_group = dims, tp_group

    def __getitem__(self, name):
        assert name in ("tp", "cp_tp"), name     # cp_tp: the tp ranks when cp is 1
        return self.tp_group


def _tp_apply(section, rank):
    model = mf_models.build_model(section, seed=3)
    full = {n: p.asnumpy().copy() for n, p in model.parameters_and_names()}
    group = Group(label="tp", ranks=(0, 1), rank=rank, name="mf_test_never_used", backend="mccl", is_world=False)
    mf_models.parallelize_model(model, _Mesh(mp.ParallelDims(2, tp=2), group))
    return model, full, {n: p.asnumpy() for n, p in model.parameters_and_names()}


def _rows(a, rank):
    return np.split(a, 2, 0)[rank]


def _cols(a, rank):
    return np.split(a, 2, 1)[rank]


@pytest.mark.parametrize("rank", [0, 1])
def test_llama_tp_slices(rank):
    model, full, got = _tp_apply(mf_models.tiny_model_section("llama", tie_word_embeddings=True,
                                                               attention_bias=True), rank)
    assert set(got) == set(full)
    np.testing.assert_array_equal(got["tok_embeddings.weight"], _rows(full["tok_embeddings.weight"], rank))
    assert model.output.weight is model.tok_embeddings.weight           # tied: resliced once, shared
    for i in range(2):
        p = f"layers.{i}."
        for w in ("wq", "wk", "wv"):
            np.testing.assert_array_equal(got[p + f"attention.{w}.weight"], _rows(full[p + f"attention.{w}.weight"], rank))
            np.testing.assert_array_equal(got[p + f"attention.{w}.bias"], _rows(full[p + f"attention.{w}.bias"], rank))
        np.testing.assert_array_equal(got[p + "attention.wo.weight"], _cols(full[p + "attention.wo.weight"], rank))
        np.testing.assert_array_equal(got[p + "attention.wo.bias"], full[p + "attention.wo.bias"])
        for w in ("w1", "w3"):
            np.testing.assert_array_equal(got[p + f"feed_forward.{w}.weight"], _rows(full[p + f"feed_forward.{w}.weight"], rank))
        np.testing.assert_array_equal(got[p + "feed_forward.w2.weight"], _cols(full[p + "feed_forward.w2.weight"], rank))
        for norm in ("attention_norm", "ffn_norm"):
            np.testing.assert_array_equal(got[p + f"{norm}.weight"], full[p + f"{norm}.weight"])
    assert model.tok_embeddings.mf_vocab_start == 32 * rank


def test_qwen3_tp_keeps_head_norms_replicated():
    model, full, got = _tp_apply(mf_models.tiny_model_section("qwen3"), 1)
    for norm in ("q_norm", "k_norm"):
        name = f"layers.0.attention.{norm}.weight"
        np.testing.assert_array_equal(got[name], full[name])
        assert set(getattr(model.layers[0].attention, norm)._mf_plan.grad_sync) == {"weight"}   # all-reduced over tp
    np.testing.assert_array_equal(got["layers.0.attention.wq.weight"], _rows(full["layers.0.attention.wq.weight"], 1))
    np.testing.assert_array_equal(got["output.weight"], _rows(full["output.weight"], 1))


@pytest.mark.parametrize("q_lora", [True, False])
def test_deepseek_tp_splits_heads_and_dense_ffn_keeps_moe_whole(q_lora):
    section = mf_models.tiny_model_section("deepseek_v3", **({} if q_lora else {"q_lora_rank": None}))
    model, full, got = _tp_apply(section, 0)
    a = "layers.0.attention."
    np.testing.assert_array_equal(got[a + ("wq_b.weight" if q_lora else "wq.weight")],
                                  _rows(full[a + ("wq_b.weight" if q_lora else "wq.weight")], 0))
    np.testing.assert_array_equal(got[a + "wkv_b.weight"], _rows(full[a + "wkv_b.weight"], 0))
    np.testing.assert_array_equal(got[a + "wo.weight"], _cols(full[a + "wo.weight"], 0))
    latent = ["wkv_a.weight", "kv_norm.weight"] + (["wq_a.weight", "q_norm.weight"] if q_lora else [])
    for name in latent:
        np.testing.assert_array_equal(got[a + name], full[a + name])
        assert getattr(model.layers[0].attention, name.split(".")[0])._mf_plan.grad_sync   # all-reduced over tp
    np.testing.assert_array_equal(got["layers.0.feed_forward.w1.weight"], _rows(full["layers.0.feed_forward.w1.weight"], 0))
    for name in ("moe.experts.w1", "moe.experts.w2", "moe.router.gate.weight", "moe.shared_experts.w2.weight"):
        np.testing.assert_array_equal(got["layers.1." + name], full["layers.1." + name])
    assert set(model.layers[1].moe.experts._mf_plan.grad_sync) == {"w1", "w2", "w3"}


def test_qwen3_moe_tp_splits_attention_and_dense_layers_keeps_moe_whole():
    model, full, got = _tp_apply(mf_models.tiny_model_section("qwen3_moe"), 1)   # layer 0 dense, 1 MoE
    for i in range(2):
        np.testing.assert_array_equal(got[f"layers.{i}.attention.wk.weight"], _rows(full[f"layers.{i}.attention.wk.weight"], 1))
        np.testing.assert_array_equal(got[f"layers.{i}.attention.q_norm.weight"], full[f"layers.{i}.attention.q_norm.weight"])
    np.testing.assert_array_equal(got["layers.0.feed_forward.w2.weight"], _cols(full["layers.0.feed_forward.w2.weight"], 1))
    for name in ("moe.experts.w1", "moe.experts.w3", "moe.router.gate.weight"):
        np.testing.assert_array_equal(got["layers.1." + name], full["layers.1." + name])
    assert set(model.layers[1].moe.experts._mf_plan.grad_sync) == {"w1", "w2", "w3"}
    model, full, got = _tp_apply(mf_models.tiny_model_section("qwen2"), 0)
    np.testing.assert_array_equal(got["layers.1.attention.wv.bias"], _rows(full["layers.1.attention.wv.bias"], 0))


@pytest.mark.parametrize("model_type, extra", [("deepseek_v3", dict(aux_loss_alpha=1e-3)),
                                               ("mixtral", dict(output_router_logits=True))])
def test_a_balance_loss_under_sequence_parallelism_takes_whole_sequence_counts(model_type, extra):
    """Sequence parallelism splits the sequences a balance loss is taken over: the plan gives the
    model the counts summed over the ranks holding them (the dist MoE cases prove the sum)."""
    model = _model(model_type, **extra)
    group = Group(label="tp", ranks=(0, 1), rank=0, name="mf_test_never_used", backend="mccl", is_world=False)
    mf_models.parallelize_model(model, _Mesh(mp.ParallelDims(2, tp=2), group))
    assert type(model.sequences).__name__ == "SplitSequences" and model.sequences.seq_parts == 1
    assert model.sequences.sum.n == 2
    plain = _model(model_type)          # no balance loss: whole-sequence counts are not needed
    mf_models.parallelize_model(plain, _Mesh(mp.ParallelDims(2, tp=2), group))
    assert type(plain.sequences).__name__ == "WholeSequences"


# ----------------------------------------------------------------------------- refusals
def _model(model_type="llama", **extra):
    return mf_models.build_model(mf_models.tiny_model_section(model_type, **extra), seed=4)


@pytest.mark.parametrize("dims, options, message", [
    (mp.ParallelDims(3, tp=3), None,
     r"parallelism.tensor_parallel: 3 does not divide model.num_attention_heads = 4; use a tensor_parallel that "
     r"divides both head counts"),
    (mp.ParallelDims(2, tp=2), None, r"parallelism.tensor_parallel: 2 does not divide model.vocab_size = 65"),
    (mp.ParallelDims(2, cp=2), dict(context_parallel_method="ring"),
     r"parallelism.context_parallel_method: must be one of colossal, ulysses, hybrid, got 'ring'"),
    (mp.ParallelDims(8, cp=8), dict(context_parallel_method="ulysses"),
     r"parallelism.context_parallel: 8 does not divide the 4 attention heads"),
    (mp.ParallelDims(2), dict(cpu_offload=True), r"parallelism.cpu_offload: means nothing on device_target CPU"),
    (mp.ParallelDims(2), dict(reshard_after_forward_policy="sometimes"),
     r"reshard_after_forward_policy: must be one of always, never, default, got 'sometimes'"),
])
def test_bad_layouts_are_one_line_and_change_nothing(dims, options, message):
    model = _model(vocab_size=65 if "vocab" in message else 64, tie_word_embeddings=True)
    before = {n: p for n, p in model.parameters_and_names()}
    group = Group(label="tp", ranks=tuple(range(dims.tp)), rank=0, name="x", backend="mccl", is_world=False)
    with pytest.raises(ValueError, match=message):
        layout = mp.Layout.for_dims(dims, options)
        mf_models.parallelize_model(model, _Mesh(dims, group), mf_models.ParallelOptions(layout))
    assert {n: p for n, p in model.parameters_and_names()} == before
    assert model.tie_word_embeddings and not hasattr(model, "output")


def test_every_registered_model_has_a_plan():
    for model_type in mf_models.available_models():
        assert mf_models.resolve_spec(model_type).parallelize is not None
