"""DeepSeek-V3's multi-token prediction (MTP) in the one training path (issue 30): the objective is
the LM loss plus mtp_loss_scaling_factor / D times the depths' losses (checked by hand on a fixed
batch), a tiny DeepSeek-V3 with one MTP module trains (its MTP loss falls) with the depth loss in
metrics.jsonl and TensorBoard and its MoE tokens counted, its checkpoint converts to Hugging Face
with the MTP layer where DeepSeek stores it and back, generation leaves the modules out, and a base
without MTP weights is refused with the fix."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from mindspore import Tensor, mint

import mf_ckpt
import mf_config
import mf_models
from mf_trainer import Trainer
from mf_trainer.loss import token_cross_entropy
from mf_trainer.mtp import MTPLMLoss, mtp_inverse_tokens

SCALE = 0.3


def _section(**over):
    return mf_models.tiny_model_section("deepseek_v3", num_nextn_predict_layers=1, mtp_loss_scaling_factor=SCALE,
                                        **over)


def _shift(x):
    return np.concatenate([x[:, 1:], np.zeros_like(x[:, :1])], 1)


def _mean_loss(logits, labels, mask, float64: bool):
    """Masked mean cross entropy: written out in float64, or mf's per-token kernel summed in float64."""
    if float64:
        x = logits.astype(np.float64)
        top = x.max(-1, keepdims=True)
        per = (np.log(np.exp(x - top).sum(-1)) + top[..., 0]) - np.take_along_axis(x, labels[..., None], -1)[..., 0]
    else:
        flat = Tensor(logits.reshape(-1, logits.shape[-1]))
        per = token_cross_entropy(flat, Tensor(labels.reshape(-1))).asnumpy().astype(np.float64).reshape(labels.shape)
    return float((per * mask).sum() / mask.sum())


def test_total_loss_is_the_lm_loss_plus_the_scaled_mtp_loss_by_hand():
    model = mf_models.build_model(_section(), seed=3, mtp=True)
    assert model.mtp_depth == 1 and not hasattr(mf_models.build_model(_section(), seed=3), "mtp")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (2, 16)).astype(np.int32)
    labels = np.concatenate([ids[:, 1:], rng.integers(0, 64, (2, 1))], 1).astype(np.int32)
    mask = (rng.random((2, 16)) > 0.2).astype(np.float32)
    inv = mtp_inverse_tokens(float(mask.sum()), [float(mask[:, 1:].sum())], 1)
    total, aux, _, _, depth = MTPLMLoss(model)(Tensor(labels), Tensor(mask), Tensor(inv), Tensor(ids))
    assert float(aux.asnumpy()) == 0.0            # no balance loss in this section: the total is LM + MTP
    # by hand: the main logits of the plain forward; depth 1 from the module's parts, composed here
    h = model.hidden_states(Tensor(ids))
    module = model.mtp[0]
    e = model.tok_embeddings(Tensor(_shift(ids)))
    x = module.eh_proj(mint.cat((module.enorm(e), module.hnorm(h)), -1))
    cos, sin, causal = model.rotary_and_mask(Tensor(ids))
    logits_1 = model.head(module.norm(module.block(x, cos, sin, causal)[0])).asnumpy()
    main_logits = model(Tensor(ids)).asnumpy()
    for float64, tolerance in ((False, 1e-6), (True, 5e-6)):
        main = _mean_loss(main_logits, labels, mask, float64)
        mtp = _mean_loss(logits_1, _shift(labels), _shift(mask), float64)
        assert abs(float(total.asnumpy()) - (main + SCALE * mtp)) < tolerance, (float64, main, mtp)
        assert abs(float(depth.asnumpy()[0]) - mtp) < tolerance
    # (float64: MindSpore's CPU LogSoftmax is ~1.5e-6 off per loss in float32; same kernel: ~2e-7)


def _records(out):
    return [r for r in (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.fixture(scope="module")
def mtp_run(tmp_path_factory, tiny_corpus, tiny_config):
    out = tmp_path_factory.mktemp("mtp")
    raw = tiny_config(out, tiny_corpus, model=_section(aux_loss_alpha=0.01),
                      training={"steps": 8, "local_batch_size": 2, "global_batch_size": 2},
                      lr_scheduler={"learning_rate": 1e-2, "warmup_steps": 1},
                      checkpoint={"save_interleaved_steps": 8, "save_max": 1},
                      monitor={"moe_monitor": {"save_tokens_per_expert_interval": 1}, "tensorboard": True})
    trainer = Trainer(mf_config.load_config(raw))
    result = trainer.train()
    return out, raw, trainer, result


def test_mtp_trains_with_its_loss_reported_and_its_tokens_counted(mtp_run):
    out, raw, trainer, result = mtp_run
    assert trainer.mode == 0          # the compiled step
    records = _records(out)
    depth = [r["mtp/loss_1"] for r in records]
    assert depth[-1] < depth[0] - 0.5 and result.losses[-1] < result.losses[0] - 1.0
    seq = raw["train_dataset"]["dataloader"]["config"]["seq_length"]
    for rec in records:
        assert rec["mtp/loss"] == pytest.approx(SCALE * rec["mtp/loss_1"], rel=1e-6)
        assert rec["mtp/loss"] + rec["moe/aux_loss"] < rec["loss"]
        # every token of the MTP block is routed to 2 experts and counted, as the decoder's layer 1
        assert sum(rec["moe/mtp0/tokens_per_expert"]) == sum(rec["moe/layer1/tokens_per_expert"]) == 2 * seq * 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert "train/mtp/loss_1" in scalars and "train/mtp/loss" in scalars
    assert [e.value for e in events.Scalars("train/mtp/loss_1")] == pytest.approx(depth)


def test_the_mtp_layer_goes_to_hugging_face_and_back(mtp_run, tmp_path):
    out, _, trainer, _ = mtp_run
    done = subprocess.run([sys.executable, "-c", "from mf_ckpt.cli import main; raise SystemExit(main())", "convert",
                           "--from", "mf", "--to", "hf", str(out / "checkpoint"), str(tmp_path / "hf")],
                          capture_output=True, text=True)       # the `mf-ckpt` console script's function
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "hf" / "config.json") as f:
        n = json.load(f)["num_hidden_layers"]
    config, state = mf_ckpt.load_hf_state(tmp_path / "hf")
    trained = mf_models.model_state(trainer.model)
    assert {k for k in trained if k.startswith("mtp.")} == {k for k in state if k.startswith("mtp.")}
    for name in ("mtp.0.eh_proj.weight", "mtp.0.block.moe.experts.w1", "mtp.0.block.moe.router.expert_bias"):
        np.testing.assert_array_equal(state[name], trained[name])
    from safetensors.numpy import load_file

    hf = load_file(str(tmp_path / "hf" / "model.safetensors"))
    np.testing.assert_array_equal(hf[f"model.layers.{n}.eh_proj.weight"], trained["mtp.0.eh_proj.weight"])
    np.testing.assert_array_equal(hf[f"model.layers.{n}.embed_tokens.weight"], trained["tok_embeddings.weight"])
    # generation leaves the MTP modules out: the HF directory loads as the causal LM alone
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)      # (the trainer compiled its step; eager generation here)
    model = mf_models.load_hf(tmp_path / "hf")
    assert not hasattr(model, "mtp")
    prompt = np.array([[5, 9, 12, 3]], np.int32)
    want = mf_models.generate(trainer.model, prompt, 4)
    np.testing.assert_array_equal(mf_models.generate(model, prompt, 4), want)
    loaded = mf_models.load_pretrained(out / "checkpoint")        # the mf checkpoint itself, as mf generate reads it
    assert not hasattr(loaded.model, "mtp")
    np.testing.assert_array_equal(mf_models.generate(loaded.model, prompt, 4), want)


def test_a_base_without_the_mtp_layer_is_refused_with_the_fix(hf_fixtures, tmp_path, tiny_corpus, tiny_config):
    """transformers saves no MTP layer (the shared fixture's config says num_nextn_predict_layers: 1)."""
    from mf_trainer import TrainerConfigError

    raw = tiny_config(tmp_path, tiny_corpus, run_mode="finetune", model={},
                      checkpoint={"load_path": str(hf_fixtures / "deepseek_v3"), "enable_save": False},
                      training={"steps": 1, "local_batch_size": 2, "global_batch_size": 2})
    raw["model"] = {}
    with pytest.raises(TrainerConfigError, match=r"holds no multi-token-prediction layer for "
                                                 r"model.num_nextn_predict_layers=1 .* set model.num_nextn_predict_layers: 0"):
        Trainer(mf_config.load_config(raw))


def test_what_mtp_and_gpt2_cannot_train_is_refused_by_the_preflight(tmp_path, tiny_corpus, tiny_config):
    from mf_trainer import preflight

    def problems(model, world=1, **sections):
        raw = tiny_config(tmp_path, tiny_corpus, model=model, **sections)
        return preflight(mf_config.load_config(raw), "train", world, "CPU", files=False).problems

    found = problems(_section(), 2, parallelism={"context_parallel": 2})
    assert ("parallelism.context_parallel", "2 with model.num_nextn_predict_layers=1 is not implemented (multi-token "
            "prediction shifts tokens and labels across the context-parallel chunks); set context_parallel: 1 or "
            "num_nextn_predict_layers: 0") in found
    found = problems(_section(tie_word_embeddings=True), 2, parallelism={"pipeline_parallel": 2})
    assert any(key == "parallelism.pipeline_parallel" and "tie_word_embeddings: true" in msg for key, msg in found)
    # GPT-2's dropout (transformers' default 0.1) runs inference as HF does, but mf trains none
    found = problems(mf_models.tiny_model_section("gpt2", attn_pdrop=0.1))
    assert found == [("model.attn_pdrop", "dropout 0.1 is not implemented; set attn_pdrop: 0.0 to train without it "
                                          "(inference applies none, as in transformers)")]
