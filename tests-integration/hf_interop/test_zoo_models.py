"""Issue 30's models on other sizes and seeds than the shared fixtures, made the same way: in the
hf_interop venv transformers builds each config with seeded random weights (every tensor random,
norms and biases included), saves it and runs it (zoo_side.py make); mf loads the directory and
gives logits within 1e-4 and the same greedy tokens, and mf-ckpt writes the directory back
byte-identical. DeepSeek-V3's and GLM-4.5's MTP layer: an mf model built with its MTP module is
saved as an HF checkpoint (the layer where DeepSeek stores it) and transformers' own MtpModel runs
it: its depth-1 logits are mf's. The venv is `MF_HF_PYTHON` (the nox session `hf_interop`);
without it the tests are skipped with that reason. Nothing downloaded: every checkpoint is made here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent


def _transformers_version(python: str) -> tuple[int, ...]:
    done = subprocess.run([python, "-c", "import transformers; print(transformers.__version__)"], capture_output=True,
                          text=True, timeout=300)
    text = done.stdout.strip() if done.returncode == 0 else "0"
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


HF_PYTHONS = [p for p in (os.environ.get("MF_HF_PYTHONS") or os.environ.get("MF_HF_PYTHON") or "").split(os.pathsep)
              if p and os.access(p, os.X_OK) and _transformers_version(p) >= (5, 23)]
pytestmark = pytest.mark.skipif(not HF_PYTHONS, reason="MF_HF_PYTHONS holds no python with torch and transformers "
                                                       ">= 5.23: run `./bootstrap nox -s hf_interop`")

# (name, transformers config, seed): sizes and switches the shared fixtures do not have.
VARIANTS = [
    ("gpt2_untied_relu", dict(model_type="gpt2", vocab_size=300, n_embd=64, n_layer=3, n_head=8, n_positions=40,
                              n_inner=80, activation_function="relu", tie_word_embeddings=False,
                              scale_attn_by_inverse_layer_idx=True, resid_pdrop=0.0, embd_pdrop=0.0,
                              attn_pdrop=0.0), 11),
    ("gpt2_gelu_erf", dict(model_type="gpt2", vocab_size=257, n_embd=48, n_layer=2, n_head=4, n_positions=32,
                           activation_function="gelu", layer_norm_epsilon=1e-3, resid_pdrop=0.0, embd_pdrop=0.0,
                           attn_pdrop=0.0), 12),
    ("glm4_quarter_rotary", dict(model_type="glm4", vocab_size=300, hidden_size=64, intermediate_size=96,
                                 num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                 attention_bias=False, max_position_embeddings=64, tie_word_embeddings=True,
                                 pad_token_id=0, eos_token_id=1,
                                 rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                                  "partial_rotary_factor": 0.25}), 13),
    ("glm", dict(model_type="glm", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                 pad_token_id=0, eos_token_id=1), 14),
    ("qwen2_moe_sparse_step", dict(model_type="qwen2_moe", vocab_size=300, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                   moe_intermediate_size=24, shared_expert_intermediate_size=40, num_experts=8,
                                   num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2,
                                   mlp_only_layers=[3], max_position_embeddings=64, qkv_bias=False), 15),
    ("glm4_moe_groups_qk_norm", dict(model_type="glm4_moe", vocab_size=300, hidden_size=64, intermediate_size=96,
                                     num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     moe_intermediate_size=24, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                                     topk_group=2, n_shared_experts=2, first_k_dense_replace=2,
                                     routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
                                     max_position_embeddings=64, num_nextn_predict_layers=0), 16),
]


@pytest.fixture(params=HF_PYTHONS or ["<none>"], ids=lambda p: Path(p).parent.parent.name)
def hf_python(request):
    return request.param


def side(python: str, *args: str) -> dict:
    done = subprocess.run([python, str(HERE / "zoo_side.py"), *args], capture_output=True, text=True, timeout=900,
                          env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name, config, seed", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_transformers_checkpoints_of_other_sizes_and_seeds(tmp_path, hf_python, name, config, seed):
    import mindspore as ms
    from safetensors.numpy import load_file

    import mf_ckpt
    import mf_models

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    hf_dir = tmp_path / name
    made = side(hf_python, "make", str(hf_dir), json.dumps({"config": config, "seed": seed, "batch": 2, "seq": 12, "new": 6}))
    ref = dict(np.load(hf_dir / "ref.npz"))
    model = mf_models.load_hf(hf_dir)
    assert mf_models.resolve_spec(config["model_type"]).architecture == made["model_class"]
    logits = model(ms.Tensor(ref["input_ids"], ms.int32)).asnumpy()
    err = float(np.abs(logits - ref["logits"]).max())
    assert err < 1e-4, err
    new = ref["greedy"].shape[1] - ref["prompt"].shape[1]
    np.testing.assert_array_equal(mf_models.generate(model, ref["prompt"], new, eos_token_id=[]), ref["greedy"])
    hf_config, state = mf_ckpt.load_hf_state(hf_dir)
    mf_ckpt.save_hf(tmp_path / "back", state, hf_config)
    want, have = load_file(str(hf_dir / "model.safetensors")), load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(want) == sorted(have)
    for key in want:
        assert want[key].tobytes() == have[key].tobytes() and want[key].shape == have[key].shape, key
    print(f"\n{name}: {made['model_class']}, {made['params']} parameters, max |logits - transformers'| {err:.1e}")


@pytest.mark.parametrize("model_type", ["deepseek_v3", "glm4_moe"])
def test_the_mtp_layer_runs_in_transformers_as_in_mf(tmp_path, hf_python, model_type):
    import mindspore as ms
    from mindspore import Tensor

    import mf_ckpt
    import mf_models

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    section = mf_models.tiny_model_section(model_type, num_nextn_predict_layers=1, tie_word_embeddings=False,
                                          initializer_range=0.1)
    model = mf_models.build_model(section, seed=4, mtp=True)
    spec, args = mf_models.build_args(section)
    config = {k: v for k, v in args.to_dict().items() if k not in ("seq_length", "compute_dtype", "params_dtype",
                                                                 "use_flash_attention", "mtp_loss_scaling_factor",
                                                                 "aux_loss_alpha", "seq_aux",
                                                                 "moe_router_bias_update_rate", "ep_size",
                                                                 "partial_rotary_factor")
              if v is not None}
    config.update(model_type=model_type, architectures=[spec.architecture])
    state = mf_models.model_state(model)
    rng = np.random.default_rng(2)
    for name in state:          # every tensor random (norms, the router bias) so the comparison sees all
        state[name] = (state[name] + rng.normal(0.0, 0.05, state[name].shape)).astype(np.float32)
    mf_models.load_state(model, state)
    mf_ckpt.save_hf(tmp_path / "hf", state, config)
    ids = rng.integers(0, section["vocab_size"], (2, 10)).astype(np.int32)
    theirs = np.asarray(side(hf_python, "mtp", str(tmp_path / "hf"), json.dumps({"ids": ids.tolist()}))["logits"])
    h, mtp_h, *_ = model.forward_train_mtp(Tensor(ids))
    ours = model.head(mtp_h[0]).asnumpy()
    err = float(np.abs(ours - theirs).max())
    assert err < 1e-4, err
    print(f"\n{model_type}: MTP depth-1 logits vs transformers' MtpModel: max diff {err:.1e}")
