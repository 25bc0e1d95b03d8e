"""swap: saved activations of the named layers / modules go to host and back (PyNative, CPU).

What is proven here, against MindSpore's own list of saved tensors (a recorder of the test's, not
mf's code, installed on every layer and module of a run without swap):
- the hooks act on exactly the named layers and modules, and each moves every activation it saves
  (count and bytes equal to the recorder's for that layer or module; parameters stay);
- gradients are bit-identical to a run without swap, with recompute on the same layer too;
- every copy comes back once, the look-ahead starts copies before backward asks for them;
- the Trainer takes the seed's two examples verbatim (context.mode 0 -> PyNative, one warning; on
  CPU one notice) and trains the losses of a run without swap, bit for bit;
- the preflight names a module a layer does not have and a module offloaded twice by two names.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import mindspore as ms
import numpy as np
import pytest

import mf_config
import mf_models
from mf_trainer import Trainer
from mf_trainer.activation_offload import ActivationOffload
from mf_trainer.swap import apply_swap

LAYERS = 3
BATCH, SEQ = 2, 16


@pytest.fixture(autouse=True)
def _pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE)


def _model(**recompute):
    model = mf_models.build_model(mf_models.tiny_model_section("llama", num_hidden_layers=LAYERS), seed=3)
    if recompute.get("layer") is not None:
        model.layers[recompute["layer"]].recompute()
    if recompute.get("module") is not None:
        layer, name = recompute["module"]
        getattr(model.layers[layer], name).recompute()
    return model


def _grads(model):
    ids = ms.Tensor(np.random.RandomState(0).randint(0, 64, (BATCH, SEQ)), ms.int32)
    weights = model.trainable_params()

    def loss(input_ids):
        return model(input_ids).astype(ms.float32).square().mean()

    value, grads = ms.value_and_grad(loss, None, weights)(ids)
    return float(value), [g.asnumpy() for g in grads]


def _swap_cfg(layer_swap=(), op_swap=(), prefetch=1):
    return mf_config.SwapConfig(enable=True, default_prefetch=prefetch,
                                layer_swap=[mf_config.LayerSwapConfig(layers=list(s)) for s in layer_swap] or None,
                                op_swap=[mf_config.OpSwapConfig(op_name=n, layers=list(s)) for n, s in op_swap] or None)


class SavedTensorRecorder:
    """What MindSpore saves for backward, attributed to the innermost layer or module running: one
    entry per distinct tensor (a view counts as its own tensor), parameters left out. Test code on
    `mindspore.saved_tensors_hooks` alone; the originals are held, so no address is reused."""

    def __init__(self, model):
        self.params = {p.data_ptr() for p in model.get_parameters()}
        self.seen: dict[str, dict[tuple, int]] = defaultdict(dict)
        self.held = []
        for i, layer in enumerate(model.layers):
            self._hook(layer, f"layers.{i}")
            for name, module in layer.name_cells().items():
                self._hook(module, f"layers.{i}.{name}")

    def _hook(self, cell, name):
        def pack(t):
            self.held.append(t)
            if t.data_ptr() not in self.params:
                self.seen[name].setdefault((t.data_ptr(), tuple(t.shape), t.dtype, tuple(t.stride())), t.nbytes)
            return t

        base = type(cell)
        base_call = base.__call__

        def __call__(cell_self, *args, **kwargs):
            with ms.saved_tensors_hooks(pack, lambda t: t):
                return base_call(cell_self, *args, **kwargs)

        cell.__class__ = type(f"Recorded{base.__name__}", (base,), {"__call__": __call__})

    def under(self, prefix: str) -> tuple[int, int]:
        """(tensors, bytes) saved inside `prefix` (a layer: its own and its modules')."""
        units = [u for u in self.seen if u == prefix or u.startswith(prefix + ".")]
        return sum(len(self.seen[u]) for u in units), sum(sum(self.seen[u].values()) for u in units)


@pytest.fixture(scope="module")
def plain():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    return _grads(_model())


@pytest.fixture(scope="module")
def recorded():
    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = _model()
    recorder = SavedTensorRecorder(model)
    return recorder, _grads(model)


def test_the_host_copy_is_a_copy_on_cpu():
    """What the offload relies on: `to("CPU", copy=True)` copies even where the device is the host
    (without `copy` it is the same buffer), so the round trip below is a real one."""
    x = ms.Tensor(np.arange(6, dtype=np.float32))
    assert x.to("CPU", copy=True).data_ptr() != x.data_ptr() and x.to("CPU").data_ptr() == x.data_ptr()


def test_exactly_the_named_units_move_what_they_save(plain, recorded):
    recorder, recorded_grads = recorded
    model = _model()
    offload = apply_swap(model, _swap_cfg(layer_swap=[["0"]], op_swap=[("self_attention", ["1"]), ("mlp", ["2"])]),
                         "CPU")
    loss, grads = _grads(model)
    stats = offload.stats
    assert list(stats.units) == ["layers.0", "layers.1.attention", "layers.2.feed_forward"]
    for unit, got in stats.units.items():
        count, nbytes = recorder.under(unit)
        assert count > 0 and (got.packed, got.bytes_out) == (count, nbytes), unit
        assert got.calls == 1 and got.kept > 0          # the layer's weights, saved by its matmuls, stayed
    # the rest of the model saved activations too, and none of them moved
    others = [u for u in recorder.seen if not any(u == s or u.startswith(s + ".") for s in stats.units)]
    assert {"layers.1.feed_forward", "layers.2.attention", "layers.1.attention_norm"} <= set(others)
    assert stats.packed == sum(recorder.under(u)[0] for u in stats.units) < sum(recorder.under(f"layers.{i}")[0]
                                                                                   for i in range(LAYERS))
    # every copy came back exactly once, and the gradients are the ones of a run without swap
    assert (stats.fetched, stats.bytes_in) == (stats.packed, stats.bytes_out)
    assert (loss, *[g.tobytes() for g in grads]) == (plain[0], *[g.tobytes() for g in plain[1]])
    assert all(np.array_equal(a, b) for a, b in zip(recorded_grads[1], grads))


class OrderedOffload(ActivationOffload):
    """Records (event, pack order) for fetches ("ahead" / "asked") and unpacks, in sequence."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.events = []

    def _fetch(self, saved, ahead):
        if saved.device is None:
            self.events.append(("ahead" if ahead else "asked", saved.order))
        super()._fetch(saved, ahead)

    def _unpack(self, saved):
        if hasattr(saved, "order"):
            self.events.append(("unpack", saved.order))
        return super()._unpack(saved)


@pytest.mark.parametrize("prefetch", [1, 2])
def test_the_look_ahead_starts_copies_before_backward_asks(plain, prefetch, monkeypatch):
    model = _model()
    offload = OrderedOffload("CPU", prefetch)
    monkeypatch.setattr("mf_trainer.swap.ActivationOffload", lambda device, k: offload)
    apply_swap(model, _swap_cfg(layer_swap=[["0-2"]], prefetch=prefetch), "CPU")
    loss, grads = _grads(model)
    assert all(np.array_equal(a, b) for a, b in zip(plain[1], grads))
    ahead = [order for kind, order in offload.events if kind == "ahead"]
    assert ahead and offload.stats.prefetched == len(ahead) and offload.stats.fetched == offload.stats.packed
    for i, (kind, order) in enumerate(offload.events):
        if kind == "ahead":   # started by the unpack just before it, of one of the `prefetch` packed after it
            asked = [o for k, o in offload.events[:i] if k == "unpack"][-1]
            assert 0 < asked - order <= prefetch
            assert ("unpack", order) not in offload.events[:i]      # before backward needed it


@pytest.mark.parametrize("recompute, swap, unit", [
    ({"layer": 0}, {"layer_swap": [["0"]]}, "layers.0"),
    ({"module": (1, "attention")}, {"op_swap": [("attention", ["1"])]}, "layers.1.attention"),
])
def test_a_recomputed_unit_moves_the_input_it_keeps(plain, recompute, swap, unit):
    """Recompute keeps a unit's inputs and rebuilds the rest in backward: swap moves the hidden
    states (what the unit would keep on the device) and leaves the shared RoPE tables and mask."""
    model = _model(**recompute)
    offload = apply_swap(model, _swap_cfg(**swap), "CPU")
    loss, grads = _grads(model)
    got = offload.stats.units[unit]
    assert (got.packed, got.bytes_out) == (1, BATCH * SEQ * 32 * 4)      # [batch, seq, hidden] float32
    assert got.kept == 3                                                # cos, sin, the mask
    assert all(np.array_equal(a, b) for a, b in zip(plain[1], grads))


def test_a_path_the_layer_lacks_is_one_line():
    model = _model()
    with pytest.raises(mf_trainer_error(), match=r"^swap.op_swap\[0\].op_name \(layer 1\): 'mlp.w9' is not a "
                                                 r"module of the layer; FeedForward holds: w1, w2, w3$"):
        apply_swap(model, _swap_cfg(op_swap=[("mlp.w9", ["1"])]), "CPU")


def mf_trainer_error():
    import mf_trainer

    return mf_trainer.TrainerConfigError


# ----------------------------------------------------------------------------- the Trainer

SEED_LAYER_SWAP = """\
swap:
  enable: True
  default_prefetch: 1
  layer_swap:
    - layers: ['0-1']          # offload 第 0、1 层
"""
SEED_OP_SWAP = """\
swap:
  enable: True
  op_swap:
    - op_name: "attention"
      layers: ['0']            # 第 0 层的 attention 算子 offload
    - op_name: "mlp"
      layers: ['1']            # 第 1 层的 mlp 算子 offload
"""


# Step 2's loss is computed with step 1's update: equal losses mean equal gradients too.
TWO_STEPS = {"steps": 2, "local_batch_size": 2, "global_batch_size": 2}


@pytest.fixture(scope="module")
def pynative_losses(tmp_path_factory, tiny_corpus, tiny_config):
    raw = tiny_config(tmp_path_factory.mktemp("plain"), tiny_corpus, context={"mode": 1}, training=TWO_STEPS)
    return Trainer(mf_config.load_config(raw)).train().losses


@pytest.mark.parametrize("block, units", [(SEED_LAYER_SWAP, ["layers.0", "layers.1"]),
                                          (SEED_OP_SWAP, ["layers.0.attention", "layers.1.feed_forward"])],
                         ids=["layer_swap", "op_swap"])
def test_the_seed_examples_train_the_same_losses(tmp_path, tiny_corpus, tiny_config, pynative_losses, caplog,
                                                 block, units):
    import yaml

    raw = tiny_config(tmp_path, tiny_corpus, training=TWO_STEPS, **yaml.safe_load(block))   # context.mode 0
    with caplog.at_level(logging.INFO, logger="mf_trainer"):
        trainer = Trainer(mf_config.load_config(raw))
        losses = trainer.train().losses
    assert losses == pynative_losses and trainer.mode == 1
    lines = [r.getMessage() for r in caplog.records]
    assert [x for x in lines if x.startswith("context.mode 0:")] == [
        "context.mode 0: swap offloads through saved-tensor hooks, which run in PyNative only (GRAPH_MODE's "
        "Cell.offload reaches only primitives a Cell holds, inside lazy_inline Cells: none of mf's models' "
        "operators); training in PyNative"]
    assert [x for x in lines if x.startswith("notice: swap")] == [
        "notice: swap.enable: device_target CPU keeps activations in host memory: the selected ones are still copied "
        "out and back, but nothing is freed and default_prefetch has no transfer to hide"]
    step = [x for x in lines if x.startswith("swap: step 1: ")]
    assert len(step) == 1 and all(f"{u} " in step[0] for u in units), step
    assert list(trainer.offload.stats.units) == units
    assert all(u.packed > 0 and u.calls == 2 for u in trainer.offload.stats.units.values())   # one call a step


# ----------------------------------------------------------------------------- preflight

ALIASES = "mlp, self_attention, self_attn, input_layernorm, pre_mlp_layernorm, post_attention_layernorm"


def _preflight(tmp_path, tiny_config, swap, model=None):
    import mf_trainer

    sections = {"swap": swap}
    if model is not None:
        sections["model"] = model
    cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", **sections))
    return mf_trainer.preflight(cfg, "train", world=1, device="CPU").lines()


def test_preflight_accepts_both_spellings_and_names_what_a_layer_lacks(tmp_path, tiny_config):
    on = {"enable": True}
    assert _preflight(tmp_path, tiny_config, {**on, "op_swap": [{"op_name": "mlp", "layers": ["0"]},
                                                                {"op_name": "self_attention", "layers": ["0-1"]}]}) == []
    assert _preflight(tmp_path, tiny_config, {**on, "op_swap": [{"op_name": "moe", "layers": ["1"]}]}) == [
        "swap.op_swap[0].op_name: 'moe' is not a module of layer 1; its modules are attention_norm, attention, "
        "ffn_norm, feed_forward (or MindFormers' names for them: " + ALIASES + ")"]
    assert _preflight(tmp_path, tiny_config, {**on, "op_swap": [{"op_name": "mlp", "layers": ["0-1"]},
                                                                {"op_name": "feed_forward", "layers": ["1"]}]}) == [
        "swap.op_swap[1].op_name: 'feed_forward' is feed_forward in layer 1, already offloaded by swap.op_swap[0]"]
    # a routed layer's MLP is its moe, by either name
    dsv3 = mf_models.tiny_model_section("deepseek_v3")
    assert _preflight(tmp_path, tiny_config, {**on, "op_swap": [{"op_name": "mlp", "layers": ["0-1"]},
                                                                {"op_name": "moe", "layers": ["0"]}]}, dsv3) == [
        "swap.op_swap[1].op_name: 'moe' is not a module of layer 0; its modules are attention_norm, attention, "
        "ffn_norm, feed_forward (or MindFormers' names for them: " + ALIASES + ")"]


def test_swap_fields_with_nothing_to_act_on_are_one_notice_each(tmp_path, tiny_config):
    import mf_trainer

    def notices(swap, device):
        cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", swap=swap))
        report = mf_trainer.preflight(cfg, "train", world=1, device=device)
        assert report.ok
        return report.notice_lines()

    assert notices({"default_prefetch": 1, "layer_swap": [{"layers": ["0"]}]}, "CPU") == [
        "notice: swap.layer_swap: set while swap.enable is false: nothing to act on"]
    assert notices({"default_prefetch": 2}, "Ascend") == [
        "notice: swap.default_prefetch: set while swap.enable is false: nothing to act on"]
    on = {"enable": True, "layer_swap": [{"layers": ["0"]}]}
    assert notices(on, "Ascend") == [] and len(notices(on, "CPU")) == 1


# ----------------------------------------------------------------------------- what the README says

def _readme_block() -> str:
    from pathlib import Path

    text = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Activation swap (`swap`)"):]
    return section[section.index("```yaml\n") + 8:section.index("```\n", section.index("```yaml\n") + 8)]


def test_the_readme_example_offloads_what_it_says(plain, tmp_path, tiny_config):
    import yaml

    import mf_trainer

    swap = yaml.safe_load(_readme_block())["swap"]
    cfg = mf_config.load_config(tiny_config(tmp_path, tmp_path / "none", swap=swap, model={"num_hidden_layers": 4}))
    assert mf_trainer.preflight(cfg, "train", world=1, device="CPU").lines() == []
    model = mf_models.build_model(mf_models.tiny_model_section("llama", num_hidden_layers=4), seed=3)
    offload = apply_swap(model, cfg.swap, "CPU")
    _grads(model)
    assert list(offload.stats.units) == ["layers.0", "layers.1", "layers.2.attention", "layers.3.feed_forward"]
    assert all(u.packed > 0 for u in offload.stats.units.values())


def test_cell_offload_reaches_two_operators_of_a_compiled_layer(tmp_path):
    """Why swap trains in PyNative: GRAPH_MODE's Cell.offload on a llama layer marks the attention
    core's two batch matmuls (the only primitives the layer's Cells hold) of the 137 operators of
    its compiled forward (the count moves with the model's code: 122 before the explicit
    broadcasts of mf-models 0.9.0), and MindSpore's CPU compile inserts no move (MoveTo) for them."""
    import re

    model = mf_models.build_model(mf_models.tiny_model_section("llama"), seed=3)
    model.layers[0].offload(backward_prefetch=1)

    class Step(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            self.weights = ms.ParameterTuple(model.trainable_params())
            self.grad = ms.value_and_grad(self.loss, None, self.weights)
            self.model = model

        def loss(self, ids):
            return self.model(ids).astype(ms.float32).square().mean()

        def construct(self, ids):
            return self.grad(ids)[0]

    ms.set_context(mode=ms.GRAPH_MODE, save_graphs=True, save_graphs_path=str(tmp_path))
    try:
        Step()(ms.Tensor(np.zeros((1, 8)), ms.int32))
    finally:
        ms.set_context(mode=ms.PYNATIVE_MODE, save_graphs=False)
    (ir,) = tmp_path.rglob("*_validate_*.ir")
    text = ir.read_text()
    layer = "Default/model-LlamaForCausalLM/layers-CellList/0-TransformerBlock/"
    ops = {m for m in re.findall(re.escape(layer) + r"[^ )]*", text)
           if not re.search(r"/(Load|Depend|UpdateState|MakeTuple|TupleGetItem)-op", m)}
    marked = re.findall(r"= (\w+)\(.*primitive_attrs: \{.*offload: Bool\(1\)", text)
    assert sorted(marked) == ["PrimFunc_BatchMatMul", "PrimFunc_BatchMatMul"]
    assert len(ops) > 100  # two of a layer's many operators
    assert not any("MoveTo" in f.read_text() for f in tmp_path.rglob("*.ir"))
