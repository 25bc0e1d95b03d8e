"""GLM-4.5 hyper-parameters (HF `Glm4MoeConfig` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..deepseek_v3.args import check_deepseek_moe
from ..errors import ModelConfigError
from ..glm4.args import set_rotary_dim
from ..llama.args import LlamaArgs


@dataclass
class Glm4MoeArgs(LlamaArgs):
    """GLM-4.5 / GLM-4.5-Air (Glm4MoeForCausalLM): Llama's GQA attention (q/k/v biases with
    `attention_bias`, o_proj never; per-head q/k RMSNorms with `use_qk_norm`), RoPE over the first
    `partial_rotary_factor` (0.5 unless the config says otherwise) of each head in rotate_half
    order, dense SwiGLU layers below `first_k_dense_replace`, then DeepSeek-V3's MoE: a sigmoid
    router with an aux-loss-free correction bias, group-limited (`n_group` / `topk_group`; the
    experts of unchosen groups score -inf, as HF), `norm_topk_prob`, `routed_scaling_factor`, and
    `n_shared_experts` shared experts.

    `num_nextn_predict_layers` multi-token-prediction modules (HF's default 1; checkpoints store
    them as layer `num_hidden_layers`) are DeepSeek-V3's (deepseek_v3/args.py): built for training
    only, their loss weighted by `mtp_loss_scaling_factor`. DeepSeek's training keys apply too:
    `aux_loss_alpha` / `seq_aux` (a balance loss; absent means none, as in HF's config) and
    `moe_router_bias_update_rate` (the bias update, default 1e-3).
    """

    partial_rotary_default = 0.5

    vocab_size: int = 151552
    hidden_size: int = 4096
    intermediate_size: int = 10944
    num_hidden_layers: int = 46
    num_attention_heads: int = 96
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    partial_rotary_factor: float | None = None
    use_qk_norm: bool = False
    moe_intermediate_size: int = 1408
    num_experts_per_tok: int = 8
    n_shared_experts: int = 1
    n_routed_experts: int = 128
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    first_k_dense_replace: int = 1
    norm_topk_prob: bool = True
    num_nextn_predict_layers: int = 1
    mtp_loss_scaling_factor: float = 0.1
    output_router_logits: bool = False
    topk_method: str = "noaux_tc"
    scoring_func: str = "sigmoid"
    moe_layer_freq: int = 1
    aux_loss_alpha: float = 0.0
    seq_aux: bool = True
    moe_router_bias_update_rate: float = 1e-3

    def validate(self) -> None:
        super().validate()
        if self.mlp_bias:
            raise ModelConfigError("model.mlp_bias: GLM-4.5's MLPs have no biases; remove the key")
        self.qkv_bias, self.o_bias = self.attention_bias, False
        set_rotary_dim(self)
        check_deepseek_moe(self, "GLM-4.5")

    def is_moe_layer(self, i: int) -> bool:
        return self.first_k_dense_replace <= i < self.num_hidden_layers

    def moe_sizes(self) -> tuple[int, int, int, int]:
        return (self.n_routed_experts, self.num_experts_per_tok, self.moe_intermediate_size,
                self.moe_intermediate_size * self.n_shared_experts)

    def tensor_parallel_split(self) -> tuple[tuple[int, int | None], dict[str, int]]:
        sizes = {"vocab_size": self.vocab_size}
        if self.first_k_dense_replace > 0:
            sizes["intermediate_size"] = self.intermediate_size
        return (self.num_attention_heads, self.num_key_value_heads), sizes

    def balance_loss_key(self) -> str | None:
        return "aux_loss_alpha" if self.aux_loss_alpha != 0 else None

    def expert_bias_rate(self) -> float:
        return float(self.moe_router_bias_update_rate)
