"""MoE training in the one training path: balance loss in the objective, DeepSeek's aux-loss-free
expert-bias update (against a float64 numpy replay of the rule), routing metrics, the MoE monitor,
and a checkpoint round-trip of the expert bias."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mf_config
import mf_models
from mf_trainer import StopAtStep, Trainer, preflight
from mf_trainer.moe import MoELMLoss
from mf_trainer.optimizer import AdamW
from mf_trainer.step import StepRunner

RATE = 1e-3          # DeepSeek's rate: moe_router_bias_update_rate's default
ALPHA = 0.05
ONE_GRAPH = {"local_batch_size": 2, "global_batch_size": 2}


def _deepseek(**over):
    return mf_models.tiny_model_section("deepseek_v3", **{"aux_loss_alpha": ALPHA, "seq_aux": True, **over})


def _trainer(raw, callbacks=()):
    return Trainer(mf_config.load_config(raw), callbacks=list(callbacks))


def _records(out_dir):
    """The training steps' records (metrics.jsonl also holds start and checkpoint records)."""
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r]


def _biases(trainer) -> np.ndarray:
    return np.stack([layer.moe.router.expert_bias.asnumpy() for layer in trainer.model.layers if layer.moe_enabled])


@pytest.fixture(scope="module")
def deepseek_run(tmp_path_factory, tiny_corpus, tiny_config):
    out = tmp_path_factory.mktemp("deepseek")
    raw = tiny_config(out, tiny_corpus, model=_deepseek(), training={**ONE_GRAPH, "steps": 6},
                      lr_scheduler={"learning_rate": 1e-2, "warmup_steps": 1},
                      checkpoint={"save_interleaved_steps": 3, "save_max": 2},
                      monitor={"moe_monitor": {"save_tokens_per_expert_interval": 1}})
    trainer = _trainer(raw)
    result = trainer.train()
    return raw, trainer, result, _records(out)


def test_deepseek_trains_with_its_balance_loss_and_metrics(deepseek_run):
    raw, trainer, result, records = deepseek_run
    assert len(result.losses) == 6 and result.losses[-1] < result.losses[0] - 0.3
    assert trainer.mode == 0        # the compiled step (has_aux value_and_grad), no PyNative fallback
    seq, k = raw["train_dataset"]["dataloader"]["config"]["seq_length"], 2
    for rec in records:
        assert rec["moe/aux_loss"] > 0 and rec["moe/dropped"] == 0.0 and rec["moe/padded"] >= 0
        # DeepSeek's sequence-wise loss of E experts, balanced routing -> alpha * L; never below 0
        assert rec["moe/aux_loss"] < rec["loss"]
        # the only MoE layer is layer 1 (first_k_dense_replace 1); every assignment is counted
        load = np.asarray(rec["moe/layer1/tokens_per_expert"])
        assert "moe/layer0/tokens_per_expert" not in rec and load.shape == (4,)
        assert load.sum() == 2 * seq * k
        assert rec["moe/layer1/imbalance"] == pytest.approx(load.max() / load.mean())
        assert rec["moe/max_imbalance"] == pytest.approx(rec["moe/layer1/imbalance"])


def _replayed_bias(records) -> np.ndarray:
    """float64 replay of bias += rate * sign(mean(load) - load) from the logged loads."""
    bias = np.zeros(4)
    for rec in records:
        load = np.asarray(rec["moe/layer1/tokens_per_expert"], np.float64)
        bias += RATE * np.sign(load.mean() - load)
    return bias


def test_expert_bias_follows_deepseeks_sign_rule(deepseek_run):
    _, trainer, _, records = deepseek_run
    bias = _replayed_bias(records)
    assert np.abs(bias).max() > 0
    np.testing.assert_allclose(_biases(trainer)[0], bias, atol=1e-7)


def test_checkpoint_round_trip_keeps_the_expert_bias(deepseek_run, tmp_path):
    raw, full, full_result, records = deepseek_run
    raw = {**raw, "output_dir": str(tmp_path)}
    # an odd step: the tiny model's two expert groups trade places every step, so after an even
    # number of steps the bias can be back at zero
    first = _trainer(raw, [StopAtStep(3)]).train()
    assert first.checkpoint.endswith("iteration_00000003")
    resumed = _trainer({**raw, "checkpoint": {**raw["checkpoint"], "load_path": str(tmp_path / "checkpoint")}})
    loaded = _replayed_bias(records[:3])
    assert np.abs(loaded).max() > 0
    np.testing.assert_allclose(_biases(resumed)[0], loaded, atol=1e-7)     # loaded, not the zero init
    second = resumed.train()
    assert first.losses + second.losses == full_result.losses   # exact
    np.testing.assert_array_equal(_biases(resumed), _biases(full))


def test_a_zero_rate_leaves_the_bias_alone(tmp_path, tiny_corpus, tiny_config):
    raw = tiny_config(tmp_path, tiny_corpus, model=_deepseek(moe_router_bias_update_rate=0.0),
                      training={**ONE_GRAPH, "steps": 2}, checkpoint={"enable_save": False})
    trainer = _trainer(raw)
    trainer.train()
    assert not _biases(trainer).any()
    assert all("moe/layer1/tokens_per_expert" not in r for r in _records(tmp_path))   # monitor off


def test_mixtral_trains_with_the_switch_loss(tmp_path, tiny_corpus, tiny_config):
    model = mf_models.tiny_model_section("mixtral", output_router_logits=True, router_aux_loss_coef=0.1)
    raw = tiny_config(tmp_path, tiny_corpus, model=model, training={"steps": 4},
                      checkpoint={"enable_save": False},
                      monitor={"moe_monitor": {"save_tokens_per_expert_interval": 2, "target_layers": [1]}})
    result = _trainer(raw).train()
    records = _records(tmp_path)
    assert result.losses[-1] < result.losses[0]
    # transformers' switch loss: coef * E * sum_e f_e p_e >= coef (equality when balanced)
    assert all(r["moe/aux_loss"] >= 0.1 - 1e-6 for r in records)
    assert [("moe/layer1/tokens_per_expert" in r, "moe/layer0/tokens_per_expert" in r) for r in records] == [
        (False, False), (True, False), (False, False), (True, False)]


def _batch(seed, rows=2, seq=16, vocab=64):
    rng = np.random.RandomState(seed)
    return {"input_ids": rng.randint(0, vocab, (rows, seq)), "labels": rng.randint(0, vocab, (rows, seq)),
            "loss_mask": np.ones((rows, seq), np.float32)}


def _step(accumulation, aux_weight, alpha=ALPHA):
    model = mf_models.build_model(_deepseek(aux_loss_alpha=alpha), seed=3)
    opt = AdamW(model.trainable_params(), weight_decay=0.0)
    batch = _batch(0)
    micro = [{k: v[i:i + 1] for k, v in batch.items()} for i in range(2)] if accumulation == 2 else [batch]
    runner = StepRunner(MoELMLoss(model, None, aux_weight), opt, 1e9, accumulation)
    return runner(micro, 1e-3), model


@pytest.mark.usefixtures("graph_mode")
def test_the_objective_does_not_depend_on_how_the_batch_is_split():
    whole, _ = _step(1, 1.0)
    split, _ = _step(2, 0.5)     # each micro-batch's balance loss weighted 1 / accumulation
    assert split.loss == pytest.approx(whole.loss, rel=1e-6)
    assert split.grad_norm == pytest.approx(whole.grad_norm, rel=1e-5)
    aux, load, counts = whole.extras
    np.testing.assert_allclose(split.extras[0], aux, rtol=1e-6)
    np.testing.assert_array_equal(split.extras[1], load)              # tokens per expert add up
    assert load.sum() == 2 * 16 * 2 and counts[:, 0].sum() == split.extras[2][:, 0].sum() == 0   # dropless
    # (padding rows depend on the micro-batch size: blocks are sized to each micro-batch's load)
    # the balance loss is part of the objective: without it the loss drops by the aux value
    plain, _ = _step(1, 1.0, alpha=0.0)
    assert whole.extras[0] > 0 and plain.extras[0] == 0
    assert whole.loss - plain.loss == pytest.approx(float(whole.extras[0]), rel=1e-4)


MONITOR_NOTICED = [
    ("llama", {"save_tokens_per_expert_interval": 5},
     "notice: monitor.moe_monitor: model 'llama' has no routed MoE layers"),
    ("deepseek_v3", {"save_tokens_per_expert_interval": 5, "target_layers": [0, 1]},
     "notice: monitor.moe_monitor.target_layers: layer 0 has no routed experts (the MoE layers are 1): not monitored"),
    ("qwen3_moe", {"target_layers": [1]},
     "notice: monitor.moe_monitor.target_layers: set while save_tokens_per_expert_interval is null"),
]


@pytest.mark.parametrize("model_type, monitor, line", MONITOR_NOTICED, ids=[c[0] for c in MONITOR_NOTICED])
def test_moe_monitor_with_nothing_to_record_is_a_notice(tmp_path, tiny_corpus, tiny_config, model_type, monitor,
                                                        line):
    """As MindFormers' monitor: target_layers are decoder layer ids; one line per target without
    experts, the others monitored (telemetry with nothing to act on is never refused)."""
    raw = tiny_config(tmp_path, tiny_corpus, model=mf_models.tiny_model_section(model_type),
                      monitor={"moe_monitor": monitor})
    report = preflight(mf_config.load_config(raw), "train", 1, "CPU")
    assert report.problems == [] and [n for n in report.notice_lines() if n.startswith(line)], report.notice_lines()


def test_moe_monitor_on_moe_layers_is_accepted(tmp_path, tiny_corpus, tiny_config):
    raw = tiny_config(tmp_path, tiny_corpus, model=mf_models.tiny_model_section("qwen3_moe"),
                      monitor={"moe_monitor": {"save_tokens_per_expert_interval": 5, "target_layers": [1]}})
    assert preflight(mf_config.load_config(raw), "train", 1, "CPU").problems == []


class _Writer:
    def __init__(self):
        self.calls = []

    def add_scalar(self, tag, value, step):
        self.calls.append(("scalar", tag, value, step))

    def add_histogram_raw(self, tag, **kw):
        self.calls.append(("histogram", tag, kw))


def test_tensorboard_gets_the_moe_scalars_and_one_bucket_per_expert():
    from mf_trainer.moe import write_tensorboard

    writer = _Writer()
    write_tensorboard(writer, {"loss": 1.0, "moe/aux_loss": 0.5, "moe/layer1/tokens_per_expert": [3.0, 0.0, 5.0]}, 7)
    assert writer.calls[0] == ("scalar", "moe/aux_loss", 0.5, 7) and len(writer.calls) == 2
    kind, tag, hist = writer.calls[1]
    assert (kind, tag, hist["global_step"]) == ("histogram", "moe/layer1/tokens_per_expert", 7)
    assert hist["bucket_counts"] == [3.0, 0.0, 5.0] and hist["bucket_limits"] == [0.5, 1.5, 2.5]
    assert hist["num"] == 8.0 and hist["sum"] == 10.0 and hist["sum_squares"] == 20.0
