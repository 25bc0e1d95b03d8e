"""The all-to-all dispatcher's own arithmetic on a one-rank ep group (every collective is then the
identity): the per-assignment send buffer, the null-expert layout of the received rows and the
combine reproduce the one-rank dispatcher's outputs, gradients and loads. The exchange itself is
proven on 2 ranks by the dist case moe_ep2 (tests-integration/dist/test_moe_parity.py)."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

import mf_parallel as mp
from mf_models.common.dispatch import LocalDispatcher
from mf_models.common.moe import MoE, experts_forward
from mf_models.common.parallel import EXPERT_PARAMS, expert_plan
from mf_models.common.router import RouterSpec


def _run(dispatcher, experts, x, idx, w, ws):
    def fn(x, w, w1, w2, w3):
        rows, block_expert, handle, load, _ = dispatcher.dispatch(x, ms.Tensor(idx))
        return dispatcher.combine(experts_forward(experts, w1, w2, w3, rows, block_expert), handle, w), load

    args = (ms.Tensor(x), ms.Tensor(w), *ws)
    out, load = fn(*args)
    probe = ms.Tensor(np.random.default_rng(1).normal(size=out.shape).astype(np.float32))
    grads = ms.grad(lambda *a: (fn(*a)[0] * probe).sum(), grad_position=(0, 1, 2, 3, 4))(*args)
    return out.asnumpy(), load.asnumpy(), [g.asnumpy() for g in grads]


@pytest.mark.parametrize("routing", ["random", "one_expert_hot"])
def test_all_to_all_dispatcher_on_one_rank_is_the_local_dispatcher(routing):
    t, h, i, e, k = 19, 8, 6, 4, 2
    rng = np.random.default_rng(3)
    if routing == "random":
        idx = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    else:
        idx = np.stack([[2, rng.choice([0, 1, 3])] for _ in range(t)]).astype(np.int32)
    x = rng.normal(size=(t, h)).astype(np.float32)
    w = rng.uniform(0.1, 1, (t, k)).astype(np.float32)
    ws = [ms.Parameter(ms.Tensor(rng.normal(size=s).astype(np.float32) * 0.3), name=n)
          for n, s in (("w1", (e, i, h)), ("w2", (e, h, i)), ("w3", (e, i, h)))]
    experts = MoE(h, i, RouterSpec(e, k)).experts
    mesh = mp.init_mesh(mp.ParallelDims(1))
    ep = mp.AllToAllTokenDispatcher(mesh["ep"], e, k, LocalDispatcher(e + 1, 1))
    got, got_load, got_grads = _run(ep, experts, x, idx, w, ws)
    want, want_load, want_grads = _run(LocalDispatcher(e, k), experts, x, idx, w, ws)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_load, want_load)
    for name, a, b in zip(("x", "weights", *EXPERT_PARAMS), got_grads, want_grads):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)


def test_expert_plan_names_the_stacked_experts_of_every_moe_layer():
    import mf_models

    args = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 32,
            "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "kv_lora_rank": 16, "q_lora_rank": 24, "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4, "v_head_dim": 8}
    model = mf_models.build_model(args)
    plan = expert_plan(model)
    assert plan == {"layers.1.moe.experts": EXPERT_PARAMS, "layers.2.moe.experts": EXPERT_PARAMS}
    names = {n for n, _ in model.parameters_and_names()}
    assert all(f"{path}.{p}" in names for path, ps in plan.items() for p in ps)


def test_graph_mode_keeps_the_static_buffers_and_says_so_once(caplog):
    """Built under GRAPH_MODE the dispatcher uses the static worst-case buffers (sizes from data
    would need a host sync inside the compiled step), logs that once, and compiles to the one-rank
    MoE; built in PyNative it exchanges counts first, then variable sizes."""
    import logging

    import mf_parallel.expert_parallel as ep_module

    t, h, i, e, k = 9, 8, 6, 4, 2
    rng = np.random.default_rng(5)
    idx = np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32)
    x = rng.normal(size=(t, h)).astype(np.float32)
    w = rng.uniform(0.1, 1, (t, k)).astype(np.float32)
    ws = [(rng.normal(size=s) * 0.3).astype(np.float32) for s in ((e, i, h), (e, h, i), (e, i, h))]
    experts = MoE(h, i, RouterSpec(e, k)).experts
    group = mp.init_mesh(mp.ParallelDims(1))["ep"]

    class Layer(ms.nn.Cell):
        def __init__(self, dispatcher):
            super().__init__()
            self.dispatcher, self.experts = dispatcher, experts

        def construct(self, x, idx, w, w1, w2, w3):
            rows, block_expert, handle, _, _ = self.dispatcher.dispatch(x, idx)
            return self.dispatcher.combine(experts_forward(self.experts, w1, w2, w3, rows, block_expert), handle, w)

    args = (ms.Tensor(x), ms.Tensor(idx), ms.Tensor(w), *(ms.Tensor(a) for a in ws))
    want = Layer(LocalDispatcher(e, k))(*args).asnumpy()
    assert mp.AllToAllTokenDispatcher(group, e, k, LocalDispatcher(e + 1, 1)).variable
    ep_module._STATIC_LOGGED.discard("alltoall")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with caplog.at_level(logging.INFO, logger="mf_parallel"):
            dispatchers = [mp.AllToAllTokenDispatcher(group, e, k, LocalDispatcher(e + 1, 1)) for _ in range(2)]
        got = Layer(dispatchers[0])(*args).asnumpy()
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    assert not any(d.variable for d in dispatchers)
    said = [r.getMessage() for r in caplog.records if "static worst-case token buffers" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("alltoall under GRAPH_MODE"), said
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
