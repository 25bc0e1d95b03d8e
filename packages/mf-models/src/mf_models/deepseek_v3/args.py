"""DeepSeek-V3 hyper-parameters (HF `DeepseekV3Config` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.args import BaseArgs
from ..common.logs import log_once
from ..errors import ModelConfigError


@dataclass
class DeepseekV3Args(BaseArgs):
    """MLA attention and DeepSeek MoE.

    MLA: queries through a low-rank bottleneck when `q_lora_rank` is set (else one projection), keys
    and values from a shared `kv_lora_rank` latent plus one rope key of `qk_rope_head_dim` shared by
    all heads; q/k head size = qk_nope_head_dim + qk_rope_head_dim (`qk_head_dim`, derived), values
    `v_head_dim`. `head_dim` is HF's name for the rotary size (= qk_rope_head_dim).
    MoE (layers >= first_k_dense_replace): `n_routed_experts` of size `moe_intermediate_size`,
    `num_experts_per_tok` chosen per token among the best `topk_group` of `n_group` groups,
    `n_shared_experts` always on; dense layers use `intermediate_size`. `n_group` / `topk_group`
    default to 1 (no group limit), unlike HF's 8 / 4, so a YAML section that only sets
    `n_routed_experts` builds; HF config.json files always carry their own values.
    `num_nextn_predict_layers` multi-token-prediction modules (DeepSeek-V3 section 2.2) are built
    for training (`build_model(..., mtp=True)`, what the trainer does; common/mtp.py) and trained
    with their loss weighted by `mtp_loss_scaling_factor` / depth count (Megatron-Core's name and
    default, 0.1); they are not part of the causal LM: generation and every other model built
    without `mtp` leave them out. `num_key_value_heads` must equal the head count (MLA has
    per-head keys).

    Training as DeepSeek did (keys of DeepSeek's own config.json): `aux_loss_alpha` weights the
    balance loss, `seq_aux` makes it sequence-wise (else batch-wise); see common/balancing.py.
    DeepSeek's config.json sets 0.001; transformers' DeepseekV3Config has no such key, so absent
    means 0 (no balance loss, the behaviour of an HF config). mf extra `moe_router_bias_update_rate` (default
    1e-3, DeepSeek's bias update speed; 0 disables) is the rate of the aux-loss-free update of
    `expert_bias` that `update_expert_bias` applies after each optimizer step.
    `ep_size` is a deployment hint of DeepSeek's inference code (each of `ep_size` ranks builds
    n_routed_experts / ep_size experts): checked to divide n_routed_experts, it changes nothing
    here; the training layout is `parallelism.expert_parallel`. `quantization_config` (FP8 block
    weights with `weight_scale_inv` tensors) is refused: dequantize to bfloat16 first.
    `auto_map` names DeepSeek's remote-code classes for transformers; mf uses its own model.
    """

    vocab_size: int = 129280
    hidden_size: int = 7168
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    num_hidden_layers: int = 61
    num_attention_heads: int = 128
    n_shared_experts: int = 1
    n_routed_experts: int = 256
    routed_scaling_factor: float = 2.5
    kv_lora_rank: int = 512
    q_lora_rank: int | None = 1536
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    qk_nope_head_dim: int = 128
    qk_head_dim: int | None = None
    n_group: int = 1
    topk_group: int = 1
    num_experts_per_tok: int = 8
    first_k_dense_replace: int = 3
    norm_topk_prob: bool = True
    rope_interleave: bool = True
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    num_nextn_predict_layers: int = 0
    mtp_loss_scaling_factor: float = 0.1
    output_router_logits: bool = False
    # DeepSeek's own config.json spellings of the routing HF implements (checked, not free choices)
    topk_method: str = "noaux_tc"
    scoring_func: str = "sigmoid"
    moe_layer_freq: int = 1
    # training-time balancing (DeepSeek's config.json keys) and deployment bookkeeping
    aux_loss_alpha: float = 0.0
    seq_aux: bool = True
    moe_router_bias_update_rate: float = 1e-3
    ep_size: int = 1
    quantization_config: dict | None = None
    auto_map: dict | None = None

    def validate(self) -> None:
        super().validate()
        self._positive("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim")
        for name, derived in (("head_dim", self.qk_rope_head_dim),
                              ("qk_head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)):
            if getattr(self, name) is None:
                setattr(self, name, derived)
            elif getattr(self, name) != derived:
                raise ModelConfigError(f"model.{name}: {getattr(self, name)} contradicts the MLA sizes (expected {derived})")
        if self.qk_rope_head_dim % 2:
            raise ModelConfigError(f"model.qk_rope_head_dim: must be even for rotary embedding, got {self.qk_rope_head_dim}")
        if self.num_key_value_heads != self.num_attention_heads:
            raise ModelConfigError(
                f"model.num_key_value_heads: MLA has one key per head; must equal num_attention_heads="
                f"{self.num_attention_heads}, got {self.num_key_value_heads}")
        if self.attention_bias:
            raise ModelConfigError("model.attention_bias: biases on MLA projections are not supported; set false")
        if self.ep_size < 1 or self.n_routed_experts % self.ep_size:
            raise ModelConfigError(f"model.ep_size: {self.ep_size} must be a positive divisor of "
                                   f"n_routed_experts={self.n_routed_experts}")
        if self.ep_size > 1:
            log_once(f"model.ep_size={self.ep_size} is DeepSeek's inference deployment hint; it does not change the "
                     f"model here (expert placement comes from parallelism.expert_parallel)")
        if self.quantization_config is not None:
            method = self.quantization_config.get("quant_method", "?")
            raise ModelConfigError(
                f"model.quantization_config: {method!r}-quantized weights (block scales in weight_scale_inv "
                f"tensors) are not supported; dequantize the checkpoint to bfloat16 (e.g. DeepSeek's "
                f"fp8_cast_bf16.py) and remove the key")
        check_deepseek_moe(self, "DeepSeek-V3")

    def tensor_parallel_split(self) -> tuple[tuple[int, int | None], dict[str, int]]:
        # MLA splits the attention heads (one key per head); MoE blocks are replicated under tp, so
        # intermediate_size is split only when dense blocks exist.
        sizes = {"vocab_size": self.vocab_size}
        if self.first_k_dense_replace > 0:
            sizes["intermediate_size"] = self.intermediate_size
        return (self.num_attention_heads, None), sizes

    def balance_loss_key(self) -> str | None:
        return "aux_loss_alpha" if self.aux_loss_alpha != 0 else None

    def is_moe_layer(self, i: int) -> bool:
        return self.first_k_dense_replace <= i < self.num_hidden_layers

    def moe_sizes(self) -> tuple[int, int, int, int]:
        return (self.n_routed_experts, self.num_experts_per_tok, self.moe_intermediate_size,
                self.moe_intermediate_size * self.n_shared_experts)

    def expert_bias_rate(self) -> float:
        return float(self.moe_router_bias_update_rate)


def check_deepseek_moe(args, name: str) -> None:
    """DeepSeek's MoE keys, which GLM-4.5 shares (routed and shared experts, group-limited sigmoid
    routing, dense first layers, the balance loss and the expert-bias rate, the MTP layers and
    their loss weight), validated in place; `name` says whose balancing a refusal names."""
    args._positive("moe_intermediate_size", "n_routed_experts", "routed_scaling_factor", "n_group", "topk_group",
                   "num_experts_per_tok")
    if args.output_router_logits:
        raise ModelConfigError(f"model.output_router_logits: {name} balances with aux_loss_alpha / seq_aux "
                               "and the expert bias, not transformers' switch loss; set false")
    for key in ("aux_loss_alpha", "moe_router_bias_update_rate", "mtp_loss_scaling_factor"):
        if getattr(args, key) < 0:
            raise ModelConfigError(f"model.{key}: must be >= 0 (0 disables it), got {getattr(args, key)!r}")
    if args.n_shared_experts < 0 or args.first_k_dense_replace < 0 or args.num_nextn_predict_layers < 0:
        raise ModelConfigError("model.n_shared_experts / first_k_dense_replace / num_nextn_predict_layers: "
                               "must be >= 0")
    for key, only in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid"), ("moe_layer_freq", 1)):
        if getattr(args, key) != only:
            raise ModelConfigError(f"model.{key}: only {only!r} is implemented, got {getattr(args, key)!r}")
    if args.n_routed_experts % args.n_group:
        raise ModelConfigError(f"model.n_group: {args.n_group} must divide n_routed_experts={args.n_routed_experts}")
    if args.n_group > 1 and args.n_routed_experts // args.n_group < 2:
        raise ModelConfigError("model.n_group: group scoring sums each group's best two experts; "
                               "needs at least 2 experts per group")
    if args.topk_group > args.n_group:
        raise ModelConfigError(f"model.topk_group: {args.topk_group} exceeds n_group={args.n_group}")
    if args.num_experts_per_tok > args.n_routed_experts // args.n_group * args.topk_group:
        raise ModelConfigError(
            f"model.num_experts_per_tok: {args.num_experts_per_tok} exceeds the experts in the "
            f"{args.topk_group} selected group(s)")
