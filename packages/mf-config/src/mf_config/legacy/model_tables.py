"""Rule tables for the model, MoE, optimizer and learning-rate sections of the older format.

`MODEL_KEYS` lists the hyper-parameters mf's models accept (mf-models' argument dataclasses, under
Hugging Face names). mf-config cannot import mf-models (it has no mf dependencies), so the lists
are written here and mf-cli's tests check them against mf-models itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from mf_config.legacy.tables import Drop, gone, moot

# model.arch.type / model_config.type of the older format -> (mf model_type, mf architecture).
ARCHITECTURES: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "ParallelLlamaForCausalLM": ("llama", "LlamaForCausalLM"),   # MindFormers' inference build of the same llama
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    "TrainingDeepseekV3ForCausalLM": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "GPT2LMHeadModel": ("gpt2", "GPT2LMHeadModel"),
    # MindFormers' ChatGLM2 classes ran ChatGLM2/3-6B and GLM-4-9B: the network transformers calls
    # GlmForCausalLM (checked field by field: model_rules._chatglm)
    "ChatGLM2ForConditionalGeneration": ("glm", "GlmForCausalLM"),
    "GlmForCausalLM": ("glm", "GlmForCausalLM"),
    "Glm4ForCausalLM": ("glm4", "Glm4ForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Glm4MoeForCausalLM": ("glm4_moe", "Glm4MoeForCausalLM"),
}
CONFIG_TYPES: dict[str, str] = {"LlamaConfig": "llama", "Qwen3Config": "qwen3", "DeepseekV3Config": "deepseek_v3",
                                "Qwen2Config": "qwen2", "MixtralConfig": "mixtral", "Qwen3MoeConfig": "qwen3_moe",
                                "GPT2Config": "gpt2", "ChatGLM2Config": "glm", "Qwen2MoeConfig": "qwen2_moe"}
MODEL_TYPES: dict[str, str] = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                               "deepseek_v3": "DeepseekV3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
                               "mixtral": "MixtralForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                               "gpt2": "GPT2LMHeadModel", "glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM",
                               "qwen2_moe": "Qwen2MoeForCausalLM", "glm4_moe": "Glm4MoeForCausalLM"}
# MindFormers ran several architectures through its llama classes; the switches that tell them apart
# pick mf's matching model (a dense llama with q/k/v biases is Qwen1.5/2; llama with experts is Mixtral).
LLAMA_VARIANTS = {"qkv_bias": "qwen2", "experts": "mixtral", "qkv_bias+experts": "qwen2_moe"}
DENSE_TO_MOE = {"llama": "mixtral", "qwen3": "qwen3_moe"}

_BASE_KEYS = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
    "tie_word_embeddings", "rope_parameters", "rope_scaling", "rope_theta", "initializer_range",
    "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "dtype", "torch_dtype",
    "transformers_version", "pretraining_tp", "seq_length", "compute_dtype", "params_dtype", "use_flash_attention",
})
_LLAMA_KEYS = _BASE_KEYS | {"attention_bias", "mlp_bias"}
_SLIDING_KEYS = frozenset({"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"})
_DEEPSEEK_MOE_KEYS = frozenset({
    "moe_intermediate_size", "n_shared_experts", "n_routed_experts", "routed_scaling_factor", "n_group", "topk_group",
    "num_experts_per_tok", "first_k_dense_replace", "norm_topk_prob", "num_nextn_predict_layers",
    "mtp_loss_scaling_factor", "output_router_logits", "topk_method", "scoring_func", "moe_layer_freq",
    "aux_loss_alpha", "seq_aux", "moe_router_bias_update_rate"})
MODEL_KEYS: dict[str, frozenset[str]] = {
    "llama": _LLAMA_KEYS,
    "qwen3": _LLAMA_KEYS | _SLIDING_KEYS,
    "deepseek_v3": _BASE_KEYS | {
        "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim", "qk_head_dim",
        "rope_interleave", "attention_bias", "ep_size", "quantization_config", "auto_map"} | _DEEPSEEK_MOE_KEYS,
    "qwen2": _LLAMA_KEYS | _SLIDING_KEYS,
    "mixtral": _BASE_KEYS | {"num_local_experts", "num_experts_per_tok", "output_router_logits",
                             "router_aux_loss_coef", "router_jitter_noise", "sliding_window"},
    "qwen3_moe": _LLAMA_KEYS | _SLIDING_KEYS | {
        "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob", "num_experts",
        "num_local_experts", "num_experts_per_tok", "output_router_logits", "router_aux_loss_coef"},
    "gpt2": _BASE_KEYS | {
        "activation_function", "add_cross_attention", "attn_pdrop", "embd_pdrop", "layer_norm_epsilon", "n_embd",
        "n_head", "n_inner", "n_layer", "n_positions", "reorder_and_upcast_attn", "resid_pdrop",
        "scale_attn_by_inverse_layer_idx", "scale_attn_weights", "summary_activation", "summary_first_dropout",
        "summary_last_dropout", "summary_proj_to_labels", "summary_type", "summary_use_proj"},
    "glm": _LLAMA_KEYS | {"partial_rotary_factor"},
    "glm4": _LLAMA_KEYS | {"partial_rotary_factor"},
    "qwen2_moe": _LLAMA_KEYS | _SLIDING_KEYS | {
        "decoder_sparse_step", "mlp_only_layers", "moe_intermediate_size", "norm_topk_prob", "num_experts",
        "num_local_experts", "num_experts_per_tok", "output_router_logits", "qkv_bias", "router_aux_loss_coef",
        "shared_expert_intermediate_size"},
    "glm4_moe": _LLAMA_KEYS | _DEEPSEEK_MOE_KEYS | {"partial_rotary_factor", "use_qk_norm"},
}

# model_config names of the older format -> the Hugging Face names mf's models use.
MODEL_RENAMES: dict[str, str] = {
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "theta": "rope_theta",
    "max_position_embedding": "max_position_embeddings",
    "param_init_type": "params_dtype",
    "layernorm_epsilon": "rms_norm_eps",
    "num_experts": "n_routed_experts",  # the mcore-style MoE key, for deepseek_v3
    "padded_vocab_size": "vocab_size",  # ChatGLM2 (glm)
    "ffn_hidden_size": "intermediate_size",
    "kv_channels": "head_dim",
}

# Keys consumed by other rules (placement, LoRA, generation...): the model rule leaves them alone.
MODEL_HANDLED_ELSEWHERE = frozenset({
    "type", "model_type", "architectures", "offset", "pp_interleave_num", "layers_per_stage", "mtp_depth",
    "pet_config", "multiple_of", "ffn_dim_multiplier", "extend_method", "scaling_factor", "qkv_has_bias",
    "untie_embeddings_and_output_weights", "hidden_act", "checkpoint_name_or_path", "top_k", "top_p",
    "do_sample", "max_new_tokens", "temperature", "repetition_penalty", "qk_layernorm", "add_bias_linear", "gated_linear_unit",
    "position_embedding_type", "hidden_dropout", "attention_dropout", "emb_dropout_prob", "rotary_pct",
})

_DTYPE = "mf-models has no per-operator dtype: norms, softmax and rotary embeddings compute in float32"
_INFER = "an incremental-inference setting; `mf generate` always decodes with a KV cache"
_KERNEL = "a fused-kernel or layout switch of MindFormers' implementation; mf-models picks its kernels itself"
MODEL_DROPS: dict[str, Drop] = {
    "batch_size": moot("the prediction batch; the training batch is runner_config.batch_size"),
    "ignore_token_id": moot("mf masks the loss with loss_mask instead of an ignore id"),
    "layernorm_compute_type": moot(_DTYPE), "layernorm_compute_dtype": moot(_DTYPE),
    "softmax_compute_type": moot(_DTYPE), "softmax_compute_dtype": moot(_DTYPE),
    "rotary_dtype": moot(_DTYPE), "router_dense_type": moot(_DTYPE),
    "embedding_init_type": gone("the embedding is initialised in params_dtype like every weight"),
    "use_past": moot(_INFER), "use_past_shard": moot(_INFER), "is_dynamic": moot(_INFER),
    "block_size": moot(_INFER), "num_blocks": moot(_INFER), "use_rope_slice": moot(_KERNEL),
    "max_decode_length": gone("a generation length that includes the prompt; `mf generate` takes "
                              "inference.max_new_tokens instead"),
    "max_length": gone("a generation length that includes the prompt; `mf generate` takes "
                       "inference.max_new_tokens instead"),
    "min_length": gone("a minimum generation length is not supported", 0, None),
    "min_new_tokens": gone("a minimum generation length is not supported", 0, None),
    "return_dict_in_generate": moot("a return-format switch of MindFormers' generate"),
    "output_scores": moot("a return-format switch of MindFormers' generate"),
    "output_logits": moot("a return-format switch of MindFormers' generate"),
    "compute_in_2d": moot(_KERNEL), "qkv_concat": moot(_KERNEL), "use_fused_rope": moot(_KERNEL),
    "use_fused_swiglu": moot(_KERNEL), "fused_rms_norm": moot(_KERNEL), "input_sliced_sig": moot(_KERNEL),
    "use_contiguous_weight_layout_attention": moot(_KERNEL), "moe_grouped_gemm": moot(_KERNEL),
    "use_attn_mask_compression": moot(_KERNEL), "use_3d_tensor_parallel": moot(_KERNEL),
    "fp32_residual_connection": moot(_DTYPE),
    "fine_grain_interleave": gone("fine-grained multi-copy interleaving is not supported", 1),
    "use_ring_attention": gone("use parallelism.context_parallel (colossal ring) instead", False),
    "parallel_optimizer": moot("see parallel.enable_parallel_optimizer"),
    "llm_backend": moot(_INFER), "quant_config": gone("quantised models are not supported", None),
    "auto_register": moot("a MindFormers class-registration path"),
    "rotary_emb_base": moot("unused by MindFormers' llama (theta set the rotary base)"),
    "return_extra_loss": moot("mf adds the auxiliary losses it trains (the MoE balance loss, the MTP loss) to the "
                              "objective itself"),
    "moe_router_pre_softmax": gone("mf's deepseek_v3 router scores with sigmoid and no pre-softmax", False),
    "moe_token_drop_policy": moot("mf's MoE never drops tokens"),
    "router_aux_loss_coef": gone("mf trains no auxiliary load-balancing loss", 0, 0.0),
    "moe_aux_loss_coeff": gone("mf trains no auxiliary load-balancing loss", 0, 0.0),
    "moe_router_load_balancing_type": gone("mf trains no auxiliary load-balancing loss", "none"),
    "pretrain_seqlen": moot("documentation of the pretrained checkpoint; the length trained is seq_length"),
}
MODEL_DEFAULT = "not a hyper-parameter of mf's {family} model"

# moe_config of the older format -> the expert keys of mf's mixtral and qwen3_moe (HF names).
MOE_RENAMES_BY_FAMILY: dict[str, dict[str, str]] = {
    "mixtral": {"expert_num": "num_local_experts", "num_experts_chosen": "num_experts_per_tok"},
    "qwen3_moe": {"expert_num": "num_experts", "num_experts_chosen": "num_experts_per_tok",
                  "moe_intermediate_size": "moe_intermediate_size", "norm_topk_prob": "norm_topk_prob"},
    "qwen2_moe": {"expert_num": "num_experts", "num_experts_chosen": "num_experts_per_tok",
                  "norm_topk_prob": "norm_topk_prob"},
}
# MindFormers' defaults (MoEConfig) where HF's differ, for the keys mixtral / qwen3_moe need.
MOE_DEFAULTS_BY_FAMILY: dict[str, dict[str, object]] = {
    "mixtral": {"num_experts_per_tok": 1},
    "qwen3_moe": {"num_experts_per_tok": 1, "norm_topk_prob": False},
    "qwen2_moe": {"num_experts_per_tok": 1, "norm_topk_prob": False},
}

# moe_config of the older format -> mf model keys (deepseek_v3).
MOE_RENAMES: dict[str, str] = {
    "expert_num": "n_routed_experts",
    "num_experts_chosen": "num_experts_per_tok",
    "shared_expert_num": "n_shared_experts",
    "routed_scaling_factor": "routed_scaling_factor",
    "norm_topk_prob": "norm_topk_prob",
    "first_k_dense_replace": "first_k_dense_replace",
    "moe_intermediate_size": "moe_intermediate_size",
    "n_group": "n_group",
    "topk_group": "topk_group",
}
# MindFormers' MoEConfig defaults for the keys mf needs, where they differ from Hugging Face's
# DeepseekV3Config defaults (which mf's model would otherwise take). None of n_group/topk_group
# means no group-limited routing: one group.
MOE_DEFAULTS: dict[str, object] = {
    "n_shared_experts": 0, "routed_scaling_factor": 1.0, "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
}
_MOE_DROPLESS = "mf's MoE is dropless: every token reaches its experts, there is no capacity"
MOE_DROPS: dict[str, Drop] = {
    "capacity_factor": moot(_MOE_DROPLESS),
    "enable_sdrop": moot(_MOE_DROPLESS),
    "max_router_load": moot(_MOE_DROPLESS),
    "aux_loss_factor": gone("mf trains no auxiliary load-balancing loss", gate="aux_loss_types"),
    "aux_loss_factors": gone("mf trains no auxiliary load-balancing loss", None, []),
    "aux_loss_types": gone("mf trains no auxiliary load-balancing loss", None, []),
    "z_loss_factor": gone("mf trains no router z-loss", 0, 0.0),
    "balance_via_topk_bias": gone("mf has no auxiliary-loss-free router-bias update during training", False),
    "topk_bias_update_rate": gone("mf has no auxiliary-loss-free router-bias update during training",
                                  gate="balance_via_topk_bias"),
    "routing_policy": moot("mf's deepseek_v3 router is the DeepSeek-V3 one (sigmoid scores, optional groups)"),
    "topk_method": moot("mf's deepseek_v3 router is the DeepSeek-V3 one (sigmoid scores, optional groups)"),
    "expert_group_size": moot("token grouping of MindFormers' dispatcher; mf dispatches per token"),
    "group_wise_a2a": moot(_KERNEL), "comp_comm_parallel": moot(_KERNEL), "comp_comm_parallel_degree": moot(_KERNEL),
    "use_fused_ops_topkrouter": moot(_KERNEL), "use_gmm": moot(_KERNEL), "use_fused_ops_permute": moot(_KERNEL),
    "enable_gmm_safe_tokens": moot(_KERNEL), "use_allgather_dispatcher": moot(_KERNEL),
    "moe_shared_expert_overlap": moot(_KERNEL), "callback_moe_droprate": gone("a drop-rate monitor (mf drops no "
                                                                              "tokens)", False),
    "expert_model_parallel": moot("expert parallelism is parallelism.expert_parallel"),
    "use_shared_expert_gating": gone("a gate on the shared expert is not part of DeepSeek-V3", False),
    "save_token_distribution": gone("use monitor.moe_monitor.save_tokens_per_expert_interval", False),
    "enable_cold_hot_expert": gone("hot/cold expert placement is not supported", False),
    "hot_expert_num": moot("used only with enable_cold_hot_expert"),
    "cold_token_percent": moot("used only with enable_cold_hot_expert"),
    "update_step": moot("used only with enable_cold_hot_expert"),
    "cur_layer": moot("internal bookkeeping of MindFormers' MoE"),
    "router_dense_type": moot(_DTYPE),
    "shared_expert_num": gone("shared experts exist only in mf's deepseek_v3", 0, 0.0),
    "moe_module_name": moot("internal bookkeeping of MindFormers' MoE"),
}


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer of the older format and MindFormers' defaults for it."""

    betas: tuple[float, float]
    eps: float
    weight_decay: float
    bias_correction: bool


_ADAM_WEIGHT_DECAY = OptimizerSpec((0.9, 0.999), 1e-6, 0.0, bias_correction=False)
OPTIMIZERS: dict[str, OptimizerSpec] = {
    "AdamW": OptimizerSpec((0.9, 0.999), 1e-8, 0.0, bias_correction=True),
    "FusedAdamW": OptimizerSpec((0.9, 0.999), 1e-8, 0.0, bias_correction=True),
    "AdamWeightDecay": _ADAM_WEIGHT_DECAY,
    "FP32StateAdamWeightDecay": _ADAM_WEIGHT_DECAY,
    "FusedAdamWeightDecay": _ADAM_WEIGHT_DECAY,
}
OPTIMIZER_DROPS: dict[str, Drop] = {
    "swap": gone("optimizer-state offload to host memory is not supported", False),
    "use_fused": moot(_KERNEL),
}

# Learning-rate schedulers mf's trainer implements (MindFormers' names and keyword arguments) and the
# pass-through keys each accepts; `min_lr` is an alias of `lr_end`.
_WARMUP = frozenset({"warmup_steps", "warmup_ratio", "warmup_lr_init", "total_steps"})
SCHEDULER_KEYS: dict[str, frozenset[str]] = {
    "ConstantWarmUpLR": _WARMUP,
    "LinearWithWarmUpLR": _WARMUP | {"lr_end", "min_lr"},
    "CosineWithWarmUpLR": _WARMUP | {"num_cycles", "lr_end", "min_lr", "decay_steps", "decay_ratio"},
    "CosineWithRestartsAndWarmUpLR": _WARMUP | {"num_cycles", "lr_end", "min_lr", "decay_steps"},
    "PolynomialWithWarmUpLR": _WARMUP | {"lr_end", "min_lr", "power", "decay_steps"},
    "WarmUpStableDecayLR": _WARMUP | {"lr_end", "min_lr", "decay_start_steps", "decay_start_ratio"},
    "ConstantWithCoolDownLR": _WARMUP | {"keep_steps", "decay_steps", "decay_ratio", "num_cycles", "lr_end1",
                                         "final_steps", "lr_end2"},
}
