"""The `model` section / HF config.json -> args: accepted keys, one clear error for bad ones."""

from __future__ import annotations

import json
import logging

import mindspore as ms
import numpy as np
import pytest

import mf_models
from mf_models import ModelConfigError, build_args, build_model, tiny_model_section

LLAMA = tiny_model_section("llama")
QWEN3 = tiny_model_section("qwen3")
DEEPSEEK = tiny_model_section("deepseek_v3")
QWEN2 = tiny_model_section("qwen2")
MIXTRAL = tiny_model_section("mixtral")
QWEN3_MOE = tiny_model_section("qwen3_moe")


def test_hf_config_json_builds_as_is(hf_fixtures, hf_name):
    name = hf_name
    config = json.loads((hf_fixtures / name / "config.json").read_text())
    spec, args = build_args(config)
    assert spec.model_type == name and spec.architecture == config["architectures"][0]
    hidden = config["n_embd"] if name == "gpt2" else config["hidden_size"]     # GPT-2's own key
    assert args.hidden_size == hidden and args.vocab_size == config["vocab_size"]


def test_yaml_section_with_mf_extras():
    section = {**QWEN3, "architectures": "Qwen3ForCausalLM", "seq_length": 32, "compute_dtype": "float32",
               "params_dtype": "float32", "use_flash_attention": False}
    spec, args = build_args(section)
    assert spec.model_type == "qwen3" and args.seq_length == 32 and args.head_dim == 12


def test_seed_yaml_model_sections_build():
    """The `model` examples of the configuration reference (seeds/000_*.txt)."""
    first = dict(model_type="deepseek_v3", architectures="DeepseekV3ForCausalLM", vocab_size=129280,
                 seq_length=4096, hidden_size=1792, num_hidden_layers=12, num_attention_heads=8,
                 use_flash_attention=True, compute_dtype="bfloat16")
    second = {**first, "intermediate_size": 3072, "n_routed_experts": 8, "num_experts_per_tok": 4}
    for section in (first, second):
        spec, args = build_args(section)
        assert spec.model_type == "deepseek_v3" and args.compute_dtype == "bfloat16" and args.use_flash_attention
    assert args.n_routed_experts == 8 and args.n_group == 1


def test_architecture_alone_selects_the_model():
    section = {k: v for k, v in LLAMA.items() if k != "model_type"}
    spec, _ = build_args({**section, "architectures": ["LlamaForCausalLM"]})
    assert spec.model_type == "llama"
    assert mf_models.available_models().items() >= {   # and every other model folder (test_model_folders.py)
        "deepseek_v3": "DeepseekV3ForCausalLM", "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM",
        "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}.items()


@pytest.mark.parametrize("change, match", [
    ({"hidden_sizee": 8}, r"^model\.hidden_sizee: unknown key for llama \(LlamaForCausalLM\); did you mean 'hidden_size'\? accepted keys: vocab_size, "),
    ({"model_type": "lama"}, r"^model\.model_type: unknown 'lama'; did you mean 'llama'\? available: deepseek_v3 \(DeepseekV3ForCausalLM\), "),
    ({"architectures": "LlamaForCausalLMM"}, r"^model\.architectures: unknown 'LlamaForCausalLMM'; did you mean 'LlamaForCausalLM'\?"),
    ({"architectures": "Qwen3ForCausalLM"}, r"does not belong to model_type 'llama'"),
    ({"architectures": ["LlamaForCausalLM", "X"]}, r"expected one architecture"),
    ({"num_key_value_heads": 3}, r"^model\.num_key_value_heads: 3 must divide num_attention_heads=4$"),
    ({"hidden_act": "gelu"}, r"^model\.hidden_act: only 'silu'"),
    ({"attention_dropout": 0.1}, r"^model\.attention_dropout: attention dropout is not implemented"),
    ({"compute_dtype": "bf16"}, r"^model\.compute_dtype: unknown dtype 'bf16'; did you mean 'bfloat16'\?"),
    ({"hidden_size": 0}, r"^model\.hidden_size: must be positive, got 0$"),
    # NaN is not <= 0: it passed, and generated "\u2047" with exit 0 (issue 31)
    ({"rms_norm_eps": float("nan")}, r"^model\.rms_norm_eps: must be a finite number, got nan$"),
    ({"rms_norm_eps": float("inf")}, r"^model\.rms_norm_eps: must be a finite number, got inf$"),
    ({"tie_word_embeddings": "yes"}, r"^model\.tie_word_embeddings: expected bool, got 'yes'$"),
    ({"vocab_size": 64.0}, r"^model\.vocab_size: expected int"),
    ({"pad_token_id": 64}, r"^model\.pad_token_id: 64 is outside the vocabulary"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, r"'dynamic' is not supported \(dynamic NTK"),
    ({"rope_parameters": {"rope_type": "yarnn", "factor": 2.0}}, r"unknown 'yarnn'; did you mean 'yarn'\?"),
    ({"rope_parameters": {"rope_type": "linear", "factr": 2.0}}, r"^model\.rope_parameters\.factr: not a parameter of rope_type 'linear'; did you mean 'factor'\?"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, r"low_freq_factor: required"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}, "rope_theta": 5e5}, r"^model\.rope_theta: 500000.0 contradicts"),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}, "rope_parameters": {"rope_type": "default"}}, r"rope_scaling\.rope_type: 'linear' contradicts"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}}, r"partial_rotary_factor: this model rotates whole heads; only 1.0"),
    ({"rope_parameters": {"rope_type": "linear", "factor": "2"}}, r"^model\.rope_parameters\.factor: expected a number, got '2'$"),
])
def test_bad_llama_section_is_one_clear_error(change, match):
    with pytest.raises(ModelConfigError, match=match) as info:
        build_args({**LLAMA, **change})
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("section, match", [
    ({**QWEN3, "use_sliding_window": True}, r"^model\.use_sliding_window: sliding-window attention is not implemented"),
    ({**QWEN3, "layer_types": ["full_attention", "sliding_attention"]}, r"^model\.layer_types\[1\]: only 'full_attention'"),
    ({**QWEN3, "layer_types": ["full_attention"]}, r"1 entries for num_hidden_layers=2"),
    ({**DEEPSEEK, "num_key_value_heads": 2}, r"MLA has one key per head"),
    ({**DEEPSEEK, "qk_head_dim": 16}, r"^model\.qk_head_dim: 16 contradicts the MLA sizes \(expected 12\)"),
    ({**DEEPSEEK, "head_dim": 8}, r"^model\.head_dim: 8 contradicts"),
    ({**DEEPSEEK, "n_group": 3}, r"^model\.n_group: 3 must divide n_routed_experts=4"),
    ({**DEEPSEEK, "topk_group": 3}, r"^model\.topk_group: 3 exceeds n_group=2"),
    ({**DEEPSEEK, "num_experts_per_tok": 3}, r"exceeds the experts in the 1 selected group"),
    ({**DEEPSEEK, "attention_bias": True}, r"^model\.attention_bias: biases on MLA projections are not supported"),
    ({**DEEPSEEK, "output_router_logits": True}, r"output_router_logits"),
    ({**DEEPSEEK, "topk_method": "greedy"}, r"^model\.topk_method: only 'noaux_tc' is implemented, got 'greedy'$"),
    ({**DEEPSEEK, "scoring_func": "softmax"}, r"^model\.scoring_func: only 'sigmoid'"),
    ({**DEEPSEEK, "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"}},
     r"^model\.quantization_config: 'fp8'-quantized weights .* are not supported; dequantize"),
    ({**DEEPSEEK, "ep_size": 3}, r"^model\.ep_size: 3 must be a positive divisor of n_routed_experts=4$"),
    ({**DEEPSEEK, "aux_loss_alpha": -0.1}, r"^model\.aux_loss_alpha: must be >= 0"),
    ({**DEEPSEEK, "moe_router_bias_update_rate": -1e-3}, r"^model\.moe_router_bias_update_rate: must be >= 0"),
    ({**QWEN2, "attention_bias": True}, r"^model\.attention_bias: Qwen2's biases are fixed"),
    ({**QWEN2, "use_sliding_window": True, "max_window_layers": 1},
     r"^model\.use_sliding_window: layer 1 would use sliding-window attention"),
    ({**QWEN2, "layer_types": ["sliding_attention", "full_attention"]}, r"^model\.layer_types\[0\]: only 'full_attention'"),
    ({**MIXTRAL, "sliding_window": 4096}, r"^model\.sliding_window: sliding-window attention is not implemented"),
    ({**MIXTRAL, "router_jitter_noise": 0.01}, r"^model\.router_jitter_noise: router input jitter is not implemented"),
    ({**MIXTRAL, "num_experts_per_tok": 5}, r"^model\.num_experts_per_tok: 5 exceeds num_local_experts=4$"),
    ({**MIXTRAL, "n_routed_experts": 4}, r"^model\.n_routed_experts: unknown key for mixtral"),
    ({**QWEN3_MOE, "num_local_experts": 8}, r"^model\.num_local_experts: 8 contradicts num_experts=4"),
    ({**QWEN3_MOE, "mlp_only_layers": [2]}, r"^model\.mlp_only_layers: 2 is not a layer index in \[0, 2\)$"),
    ({**QWEN3_MOE, "decoder_sparse_step": 0}, r"^model\.decoder_sparse_step: must be positive"),
    ({**QWEN3_MOE, "router_aux_loss_coef": -1.0}, r"^model\.router_aux_loss_coef: must be >= 0"),
    ({"vocab_size": 8}, r"^model\.model_type: missing \(and no architectures\); available: "),
])
def test_bad_sections_of_other_models(section, match):
    with pytest.raises(ModelConfigError, match=match):
        build_args(section)


def test_official_deepseek_v3_config_keys(caplog):
    """DeepSeek's own config.json carries training and deployment keys beyond transformers' class:
    aux_loss_alpha / seq_aux are used, ep_size is checked and said to change nothing, auto_map is
    bookkeeping; quantization_config is refused (see test_bad_sections_of_other_models)."""
    caplog.set_level(logging.WARNING, logger="mf_models")
    official = {**DEEPSEEK, "aux_loss_alpha": 0.001, "seq_aux": True, "ep_size": 2, "moe_layer_freq": 1,
                "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
                "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}, "torch_dtype": "bfloat16"}
    _, args = build_args(official)
    assert args.aux_loss_alpha == 0.001 and args.seq_aux and args.ep_size == 2
    assert any("ep_size=2 is DeepSeek's inference deployment hint" in r.getMessage() for r in caplog.records)
    assert build_model({**official, "seq_aux": False}).balance.kind == "batch"
    assert build_model({**official, "aux_loss_alpha": 0.0}).balance.kind == "none"


def test_qwen_moe_and_qwen2_defaults_follow_hf():
    _, args = build_args({**QWEN3_MOE, "num_experts": None, "num_local_experts": 4})
    assert args.num_experts == args.num_local_experts == 4
    _, args = build_args({k: v for k, v in QWEN3_MOE.items() if k != "head_dim"})
    assert args.head_dim == 32 // 4   # hidden / heads, as Qwen3MoeAttention without head_dim
    model = build_model({**QWEN3_MOE, "num_hidden_layers": 4, "mlp_only_layers": [], "decoder_sparse_step": 2})
    assert model.moe_layer_ids() == [1, 3]
    # sliding window switched on but reaching no layer (max_window_layers >= layers): HF uses full attention
    _, args = build_args({**QWEN2, "use_sliding_window": True, "max_window_layers": 2})
    assert args.qkv_bias and not args.o_bias


def test_legacy_rope_fields_are_understood():
    _, args = build_args({**LLAMA, "rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 4.0}})
    assert args.rope == {"rope_type": "linear", "rope_theta": 5e5, "factor": 4.0}
    _, args = build_args({**LLAMA, "rope_scaling": None, "rope_theta": 1e6})
    assert args.rope == {"rope_type": "default", "rope_theta": 1e6}


def test_bfloat16_on_cpu_computes_in_float32_and_says_so_once(caplog):
    caplog.set_level(logging.WARNING, logger="mf_models")
    model = build_model({**LLAMA, "compute_dtype": "bfloat16", "use_flash_attention": True})
    build_model({**LLAMA, "compute_dtype": "bfloat16", "use_flash_attention": True})
    messages = [r.getMessage() for r in caplog.records]
    bf16 = [m for m in messages if "bfloat16 runs in float32 on CPU" in m]
    flash = [m for m in messages if "use_flash_attention" in m]
    # once per process: a test run earlier in the session may already have said it
    assert len(bf16) <= 1 and len(flash) <= 1
    assert model.compute_dtype == ms.float32
    reference = build_model(LLAMA)
    ids = ms.Tensor(np.arange(10).reshape(2, 5), ms.int32)
    np.testing.assert_allclose(model(ids).asnumpy(), reference(ids).asnumpy(), rtol=0, atol=1e-6)


def test_bfloat16_params_are_float32_on_cpu():
    model = build_model({**DEEPSEEK, "compute_dtype": "bfloat16", "params_dtype": "bfloat16"}, seed=2)
    assert {p.dtype for p in model.get_parameters()} == {ms.float32}
    ids = ms.Tensor(np.arange(10).reshape(2, 5), ms.int32)
    np.testing.assert_array_equal(model(ids).asnumpy(), build_model(DEEPSEEK, seed=2)(ids).asnumpy())


def test_float16_compute_and_params():
    ids = ms.Tensor(np.arange(10).reshape(2, 5), ms.int32)
    reference = build_model(LLAMA)(ids).asnumpy()
    half = build_model({**LLAMA, "compute_dtype": "float16", "params_dtype": "float16"})
    assert all(p.dtype == ms.float16 for p in half.get_parameters())
    logits = half(ids).asnumpy()
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, reference, atol=2e-2)
