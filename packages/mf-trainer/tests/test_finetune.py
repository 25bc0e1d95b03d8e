"""run_mode finetune: LoRA (frozen base, adapter-only checkpoints, resume of its own save_path),
full fine-tuning (weights only, fresh optimizer), and periodic evaluation that leaves training alone.

One 8-step LoRA run with periodic evaluation (graph mode) is shared by most tests. A 10-step run of
the same config without evaluation must give the same losses bit for bit, and so must the first
run resumed from its step-8 checkpoint for steps 9 and 10. (LoRA dropout is 0 here: MindSpore's
CPU dropout kernels are not reproducible run to run when several run concurrently in one graph.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

import mf_ckpt
import mf_config
import mf_models
from mf_trainer import Trainer, TrainerConfigError

LORA = {"target_modules": r"layers\.\d+\.(attention\.w[qv]|feed_forward\.w2)", "lora_rank": 4, "lora_alpha": 8.0}
STEPS = {"steps": 8, "local_batch_size": 2, "global_batch_size": 2}


def _eval_section(raw, interval=4):
    dl = json.loads(json.dumps(raw["train_dataset"]["dataloader"]))
    dl["sizes"] = [6, 0, 0]  # a dataset of its own: its train split, 3 batches of 2
    return {"dataloader": dl, "eval_interval": interval, "eval_iters": 2}


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_config):
    """The pretrained weights a fine-tune starts from: a seeded tiny llama as an HF directory."""
    section = {**tiny_config("x", "y")["model"], "architectures": "LlamaForCausalLM"}
    model = mf_models.build_model(section, seed=11)
    state = mf_models.model_state(model)
    hf_dir = tmp_path_factory.mktemp("base") / "hf"
    mf_ckpt.save_hf(hf_dir, state, {**section, "architectures": ["LlamaForCausalLM"]})
    return str(hf_dir), state


def _lora_raw(out, corpus, tiny_config, base_dir, **sections):
    raw = tiny_config(out, corpus, training=STEPS, lora=LORA, checkpoint={"load_path": base_dir,
                                                                            "save_interleaved_steps": 4},
                      optimizer={"type": "AdamW", "weight_decay": 0.0})
    raw["lr_scheduler"] = {"type": "ConstantWarmUpLR", "learning_rate": 2e-2, "warmup_steps": 1}
    raw["run_mode"] = "finetune"
    raw.update(sections)
    return raw


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_corpus, tiny_config, base):
    out = tmp_path_factory.mktemp("lora")
    raw = _lora_raw(out, tiny_corpus, tiny_config, base[0])
    raw["eval_dataset"] = _eval_section(raw)
    trainer = Trainer(mf_config.load_config(raw))
    result = trainer.train()
    return {"out": out, "raw": raw, "trainer": trainer, "result": result}


def test_only_the_adapters_train(lora_run, base):
    trainer, (_, base_state) = lora_run["trainer"], base
    state = mf_models.model_state(trainer.model)
    adapters = {n for n in state if n.endswith((".lora_a", ".lora_b"))}
    assert adapters == {f"layers.{i}.{m}.{ab}" for i in (0, 1) for m in ("attention.wq", "attention.wv", "feed_forward.w2")
                        for ab in ("lora_a", "lora_b")}
    assert {p.name for p in trainer.model.trainable_params()} == adapters
    assert trainer.optimizer.param_names == sorted(adapters, key=list(state).index)
    for name, value in base_state.items():  # the base is untouched, bit for bit
        assert np.array_equal(state[name], value), name
    assert all(np.abs(state[n]).max() > 0 for n in adapters if n.endswith("lora_b"))  # B left zero


def test_lora_loss_falls(lora_run):
    # 8 steps of rank-4 adapters on a random base: a small fall (the 50-step SFT run in
    # tests-integration asserts a clear margin)
    losses = lora_run["result"].losses
    assert len(losses) == 8 and np.mean(losses[-3:]) < losses[0] - 0.03, losses


def test_checkpoints_hold_only_the_adapters_and_say_so(lora_run, base):
    ckpt = lora_run["out"] / "checkpoint"
    layout = mf_ckpt.load(str(ckpt), {}, strict=False)
    assert layout.iteration == 8
    meta = mf_ckpt.read_adapter_meta(layout.common)
    assert meta["type"] == "lora" and meta["rank"] == 4 and meta["alpha"] == 8.0 and meta["dropout"] == 0.0
    assert meta["base"] == os.path.abspath(base[0]) and meta["base_kind"] == "hf" and len(meta["modules"]) == 6
    _, adapter, _ = mf_ckpt.load_lora_adapter(str(ckpt))
    assert set(adapter) == {n for n in mf_models.model_state(lora_run["trainer"].model) if "lora" in n}
    model_bytes = sum(f.stat().st_size for f in (ckpt / "iteration_00000008").glob("*-model-*.safetensors"))
    base_bytes = (Path(base[0]) / "model.safetensors").stat().st_size
    assert model_bytes < 0.15 * base_bytes, (model_bytes, base_bytes)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, tiny_corpus, tiny_config, base):
    """The same fine-tune for 10 steps, without evaluation."""
    raw = _lora_raw(tmp_path_factory.mktemp("plain"), tiny_corpus, tiny_config, base[0])
    raw["training"]["steps"] = 10
    return Trainer(mf_config.load_config(raw)).train().losses


def test_periodic_evaluation_is_logged_and_changes_no_training_loss(lora_run, plain_run):
    rows = [json.loads(line) for line in (lora_run["out"] / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [4, 8] and [r["step"] for r in rows if "loss" in r] == list(range(1, 9))
    for r in evals:
        assert r["eval_ppl"] == pytest.approx(np.exp(r["eval_loss"])) and 0 <= r["eval_accuracy"] <= 1
        assert r["eval_batches"] == 2 and r["eval_tokens"] > 0
    assert evals[1]["eval_loss"] < evals[0]["eval_loss"]
    assert list((lora_run["out"] / "tensorboard").glob("events.out.tfevents.*"))
    # Evaluation draws no random number, has its own loader, and its graph leaves the training
    # step's alone: the run without it has the same losses, bit for bit.
    assert plain_run[:8] == lora_run["result"].losses


def test_a_preempted_lora_finetune_resumes_its_own_checkpoint(lora_run, plain_run):
    raw = json.loads(json.dumps(lora_run["raw"]))
    raw["training"]["steps"] = 10
    trainer = Trainer(mf_config.load_config(raw))
    assert trainer.state.step == 8 and trainer.optimizer.step == 8
    assert trainer.state.consumed_samples == lora_run["trainer"].state.consumed_samples
    saved = mf_models.adapter_state(lora_run["trainer"].model)
    assert all(np.array_equal(v, saved[k]) for k, v in mf_models.adapter_state(trainer.model).items())
    assert trainer.train().losses == plain_run[8:]  # exactly the uninterrupted run's steps 9 and 10
    rows = [json.loads(line) for line in (lora_run["out"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval_loss" in r] == [4, 8, 10]
    # other LoRA settings are another run: refused, nothing overwritten
    raw["lora"] = {**raw["lora"], "lora_rank": 2}
    with pytest.raises(TrainerConfigError, match=r"checkpoint.save_path: .* holds checkpoint 10 of a fine-tune of .* "
                                                 r"with LoRA \(it differs in lora.lora_rank \(2 here, 4 there\)\)"):
        Trainer(mf_config.load_config(raw))


def test_lora_dropout_is_active_in_the_compiled_step(tmp_path, tiny_corpus, tiny_config, base, plain_run):
    # B starts at zero, so step 1 is the same with or without dropout; so is step 2 as a rule
    # (Adam's first update is lr * sign(g), and the masks rarely flip a sign); from step 3 on the
    # masks show. Reproducibility is not asserted: MindSpore's CPU dropout is not reproducible.
    raw = _lora_raw(tmp_path, tiny_corpus, tiny_config, base[0], lora={**LORA, "lora_dropout": 0.3})
    raw["training"]["steps"] = 4
    losses = Trainer(mf_config.load_config(raw)).train().losses
    assert losses[0] == plain_run[0] and all(a != b for a, b in zip(losses[2:], plain_run[2:4])), (losses, plain_run)


def test_full_finetune_starts_from_the_weights_with_a_fresh_optimizer(lora_run, tmp_path, tiny_corpus, tiny_config):
    # load_path: a LoRA adapter checkpoint, merged into its base on load (weights only, step 0).
    raw = tiny_config(tmp_path, tiny_corpus, training=STEPS, checkpoint={"load_path": str(lora_run["out"] / "checkpoint")})
    raw["run_mode"] = "finetune"
    trainer = Trainer(mf_config.load_config(raw))
    assert trainer.state.step == 0 and trainer.optimizer.step == 0 and trainer.state.consumed_samples == 0
    _, merged = mf_ckpt.load_lora_merged_state(str(lora_run["out"] / "checkpoint"))
    state = mf_models.model_state(trainer.model)
    assert set(state) == set(merged) and all(np.array_equal(state[k], merged[k]) for k in state)
    assert len(trainer.model.trainable_params()) == len(state)


def test_finetune_refusals(lora_run, tmp_path, tiny_corpus, tiny_config, base):
    def refused(raw, message):
        with pytest.raises(TrainerConfigError) as err:
            Trainer(mf_config.load_config(raw))
        assert message in str(err.value) and "\n" not in str(err.value), str(err.value)

    raw = _lora_raw(tmp_path / "a", tiny_corpus, tiny_config, base[0], lora={**LORA, "target_modules": "attention"})
    refused(raw, "lora.target_modules: 'attention' matches none of the model's Linear modules (full names, "
                 "re.fullmatch): layers.{0-1}.attention.wq, layers.{0-1}.attention.wk")
    raw = _lora_raw(tmp_path / "b", tiny_corpus, tiny_config, str(lora_run["out"] / "checkpoint"))
    refused(raw, "is a LoRA adapter checkpoint; new adapters need plain base weights")
    raw = _lora_raw(tmp_path / "c", tiny_corpus, tiny_config, base[0])
    raw["checkpoint"]["save_path"] = base[0]
    refused(raw, "checkpoint.save_path: is checkpoint.load_path")
    # a train-mode run writes its checkpoint there: a fine-tune refuses to resume or overwrite it
    pre = tiny_config(tmp_path / "d", tiny_corpus, training={**STEPS, "steps": 1})
    Trainer(mf_config.load_config(pre)).save_checkpoint()
    raw = _lora_raw(tmp_path / "d", tiny_corpus, tiny_config, base[0])
    refused(raw, "holds checkpoint 0 of a run_mode train run of another config (it differs in ")
    train = tiny_config(tmp_path / "e", tiny_corpus, checkpoint={"load_path": str(lora_run["out"] / "checkpoint")})
    refused(train, "is a LoRA adapter checkpoint: continue it with run_mode finetune")
    refused({**train, "run_mode": "eval", "eval_dataset": _eval_section(train)}, "is not a training mode: run `mf eval CONFIG`")
