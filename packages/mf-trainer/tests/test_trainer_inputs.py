"""What the Trainer refuses, what it loads, and how it fails: one-line errors before any step."""

from __future__ import annotations

import json

import numpy as np
import pytest

import mf_ckpt
import mf_config
import mf_models
from mf_trainer import Callback, Trainer, TrainerConfigError, TrainingError


def _trainer(raw, callbacks=()):
    return Trainer(mf_config.load_config(raw), callbacks=list(callbacks))


REFUSED = [
    ({"parallelism": {"tensor_parallel": 2}}, "parallelism.tensor_parallel: 2 > 1 needs 2 ranks"),
    ({"parallelism": {"context_parallel": 2}}, "parallelism.context_parallel: 2 > 1 needs 2 ranks"),
    ({"parallelism": {"data_parallel_shard_strategy": "optim"}}, "(ZeRO-1: sharded optimizer states with replicated"),
    ({"monitor": {"train_state": {"local_norm": "wq("}}}, "monitor.train_state.local_norm: 'wq(' is not a regular"),
    ({"lora": {"target_modules": "wq"}}, "lora: LoRA adapts pretrained weights; it needs run_mode: finetune"),
    ({"run_mode": "finetune"}, "checkpoint.load_path: run_mode finetune starts from pretrained weights"),
    ({"optimizer": {"type": "Lion"}}, "optimizer.type: unknown optimizer 'Lion'; available: AdamW, Muon"),
    ({"optimizer": {"type": "Muon", "nesterof": True}}, "optimizer.nesterof: Muon takes no such key (did you mean"),
    ({"optimizer": {"type": "Muon", "adamw_params": ["fead"]}}, "optimizer.adamw_params: pattern 'fead' matches no"),
    ({"optimizer": {"amsgrad": True}}, "optimizer.amsgrad: AdamW takes no such key"),
    ({"optimizer": {"weight_decay_exclude": ["nrom"]}}, "optimizer.weight_decay_exclude: no pattern of ['nrom'] matches"),
    ({"recompute": {"mode": "select", "select_module": {"mlpp": ["0"]}}}, "the layer has no module 'mlpp'"),
    ({"lr_scheduler": {"type": "CosineWithWarmUpLR", "warmup": 2}}, "lr_scheduler.warmup: CosineWithWarmUpLR takes"),
    ({"training": {"steps": 100}}, "train_dataset.dataloader.sizes: 100 more steps of 4 samples need 400"),
    ({"model": {"num_attention_heads": 3}}, "model."),
    ({"checkpoint": {"load_path": "/nonexistent/ckpt"}}, "checkpoint.load_path:"),
]


@pytest.mark.parametrize("sections, message", REFUSED, ids=[m.split(":")[0] for _, m in REFUSED])
def test_refused_with_one_line_naming_the_field(tmp_path, tiny_corpus, tiny_config, sections, message):
    with pytest.raises(TrainerConfigError) as err:
        _trainer(tiny_config(tmp_path, tiny_corpus, **sections))
    # One keyed line per problem (the preflight lists every problem; these configs have one).
    lines = str(err.value).splitlines()
    assert message in str(err.value) and len(lines) == 1
    assert all(line.split(":")[0].count(" ") == 0 for line in lines)


# Speed, memory and telemetry knobs with nothing to act on in one CPU process: accepted, each said in
# exactly one line of the run's log (the preflight's notices; test_preflight.py has their texts).
NOTICED = {
    "parallelism.cpu_offload": {"parallelism": {"cpu_offload": True}},
    "parallelism.reshard_after_forward_policy": {"parallelism": {"reshard_after_forward_policy": "always"}},
    "parallelism.pipeline_parallel_schedule": {"parallelism": {"pipeline_parallel_schedule": "gpipe"}},
    "recompute_comm.enable": {"recompute_comm": {"enable": True, "select_module": {"attention": ["0"]}}},
    "monitor.moe_monitor": {"monitor": {"moe_monitor": {"save_tokens_per_expert_interval": 10}}},
    "profiler.profiler_level": {"profiler": {"enable_profiling": True, "profiler_level": 1, "start_step": 1,
                                             "end_step": 1}},
    "inference.batch_size": {"inference": {"batch_size": 4, "max_new_tokens": 5}},
    "context.device_id": {"context": {"device_id": 1}},
    "optimizer.weight_decay_exclude": {"optimizer": {"weight_decay_exclude": ["bias", "norm"]}},
    "swap.enable": {"swap": {"enable": True, "layer_swap": [{"layers": ["0"]}]}},     # runs; frees nothing on CPU
}


def test_knobs_with_nothing_to_act_on_are_accepted_with_one_line_each(tmp_path, tiny_corpus, tiny_config, caplog):
    sections: dict = {}
    for part in NOTICED.values():
        for name, fields in part.items():
            sections.setdefault(name, {}).update(fields)
    with caplog.at_level("INFO", logger="mf_trainer"):
        trainer = _trainer(tiny_config(tmp_path, tiny_corpus, **sections))
    notices = [r.getMessage() for r in caplog.records if r.getMessage().startswith("notice: ")]
    for key in NOTICED:
        said = [line for line in notices if line.startswith(f"notice: {key}: ")]
        assert len(said) == 1, (key, notices)
    # the weight-decay pattern that matches (norm) still applies; the MoE-less llama records no routing
    assert not trainer.moe.active


def test_the_reference_module_names_select_mf_modules(tmp_path, tiny_corpus, tiny_config, caplog):
    raw = tiny_config(tmp_path, tiny_corpus, recompute={"mode": "select", "select_module": {"attention": ["0"],
                                                                                             "mlp": ["1"]}})
    with caplog.at_level("INFO", logger="mf_trainer"):
        _trainer(raw)
    assert "recompute: layers.0.attention, layers.1.feed_forward" in caplog.text


def test_compressed_eod_mask_is_refused(tmp_path, tiny_corpus, tiny_config):
    raw = tiny_config(tmp_path, tiny_corpus)
    dl = raw["train_dataset"]["dataloader"]
    dl["config"]["create_compressed_eod_mask"] = True
    dl["column_names"] = [*dl["column_names"], "actual_seq_len"]
    with pytest.raises(TrainerConfigError) as err:
        _trainer(raw)
    assert str(err.value) == (
        "train_dataset.dataloader.config.create_compressed_eod_mask: the compressed EOD mask needs a variable-length "
        "attention kernel that mf-models does not have; it acts under parallelism.context_parallel > 1 (document ids "
        "in the cp attention), else use create_attention_mask with reset_attention_mask")


def test_hugging_face_directory_is_a_weights_only_start(tmp_path, tiny_corpus, tiny_config, hf_fixtures):
    hf_dir = hf_fixtures / "llama"
    hf_cfg = json.loads((hf_dir / "config.json").read_text())
    model = {k: v for k, v in hf_cfg.items() if k != "architectures" and v is not None}
    model["architectures"] = hf_cfg["architectures"][0]
    raw = tiny_config(tmp_path, tiny_corpus, model=model, checkpoint={"load_path": str(hf_dir)})
    trainer = _trainer(raw)
    _, reference = mf_ckpt.load_hf_state(str(hf_dir), dtype="float32")
    got = mf_models.model_state(trainer.model)
    assert sorted(got) == sorted(reference)
    assert all(np.array_equal(got[k], reference[k]) for k in got)
    assert trainer.state.step == 0 and trainer.optimizer.step == 0


def test_checkpoint_without_optimizer_state_cannot_resume_but_can_seed_weights(tmp_path, tiny_corpus, tiny_config):
    raw = tiny_config(tmp_path, tiny_corpus)
    source = _trainer(raw)
    weights = mf_models.model_state(source.model)
    weights = {k: v + 0.5 for k, v in weights.items()}
    mf_ckpt.save(str(tmp_path / "w"), 3, weights, None, common={"step": 3, "consumed_samples": 12})
    with pytest.raises(TrainerConfigError, match="cannot resume exactly: set checkpoint.no_load_optim: true"):
        _trainer(tiny_config(tmp_path, tiny_corpus, checkpoint={"load_path": str(tmp_path / "w")}))
    trainer = _trainer(tiny_config(tmp_path, tiny_corpus, checkpoint={"load_path": str(tmp_path / "w"),
                                                                      "no_load_optim": True}))
    got = mf_models.model_state(trainer.model)
    assert all(np.array_equal(got[k], weights[k]) for k in weights)
    assert trainer.state.step == 0 and trainer.state.consumed_samples == 0


class PoisonWeights(Callback):
    """Turns a weight into NaN before step `at`: every later step is non-finite."""

    def __init__(self, at):
        self.at = at

    def on_step_begin(self, trainer, step):
        if step == self.at:
            param = trainer.model.norm.weight
            param.set_data(mf_models_tensor(np.full(param.shape, np.nan, np.float32)))


def mf_models_tensor(array):
    from mindspore import Tensor

    return Tensor(array)


def test_non_finite_steps_are_skipped_then_training_stops(tmp_path, tiny_corpus, tiny_config):
    raw = tiny_config(tmp_path, tiny_corpus, training={"local_batch_size": 2, "global_batch_size": 2})
    trainer = _trainer(raw, [PoisonWeights(at=3)])
    with pytest.raises(TrainingError, match=r"2 non-finite steps in a row \(training.max_consecutive_nonfinite = 2\); "
                                            r"stopping at step 4"):
        trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    assert [r["skipped"] for r in rows] == [False, False, True, True]
    assert [r["skipped_steps"] for r in rows] == [0, 0, 1, 2]
    assert trainer.optimizer.step == 2 and rows[2]["loss"] == "nan"


def test_graph_failure_falls_back_to_pynative_from_an_untouched_state(tmp_path, tiny_corpus, tiny_config, caplog):
    raw = tiny_config(tmp_path, tiny_corpus, training={"steps": 1, "local_batch_size": 2, "global_batch_size": 2})
    trainer = _trainer(raw)
    real_call = type(trainer.runner).__call__
    first = []

    def broken_then_real(self, micro, lr):
        if not first:
            first.append(real_call(self, micro, lr))  # the update happens, then a "late" error
            raise RuntimeError("The kernel X unregistered\nsecond line")
        return real_call(self, micro, lr)

    type(trainer.runner).__call__ = broken_then_real
    try:
        result = trainer.train()
    finally:
        type(trainer.runner).__call__ = real_call
    assert trainer.mode == 1 and "falling back to PyNative" in caplog.text and "The kernel X unregistered" in caplog.text
    # the retry started from the snapshot: same loss, and one update applied, not two
    assert result.losses == pytest.approx([first[0].loss], rel=1e-6) and trainer.optimizer.step == 1
