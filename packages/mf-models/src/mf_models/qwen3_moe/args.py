"""Qwen3-MoE hyper-parameters (HF `Qwen3MoeConfig` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelConfigError
from ..qwen3.args import Qwen3Args


@dataclass
class Qwen3MoeArgs(Qwen3Args):
    """Qwen3's attention (per-head q/k RMSNorm) and, in layer i, a routed MoE when i is not in
    `mlp_only_layers` and (i + 1) % `decoder_sparse_step` == 0 (else a dense MLP of
    `intermediate_size`): `num_experts` experts of `moe_intermediate_size`, `num_experts_per_tok`
    chosen by softmax probability, renormalised only with `norm_topk_prob`; no shared expert.

    `num_experts` is also read as `num_local_experts` (the name transformers 5 writes; both may be
    given if they agree). `head_dim` defaults to hidden_size / num_attention_heads, as in HF.
    `output_router_logits: true` trains with transformers' load-balancing loss weighted by
    `router_aux_loss_coef` (common/balancing.py). Sliding-window attention is refused as for Qwen3.
    """

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 6144
    num_hidden_layers: int = 24
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 4
    head_dim: int | None = None
    moe_intermediate_size: int = 768
    num_experts_per_tok: int = 8
    num_experts: int | None = None
    num_local_experts: int | None = None
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list | None = None
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001

    def validate(self) -> None:
        super().validate()
        check_sparse_moe(self, 128)

    def is_moe_layer(self, i: int) -> bool:
        """HF's rule (Qwen3MoeDecoderLayer)."""
        return i not in self.mlp_only_layers and self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0

    def moe_sizes(self) -> tuple[int, int, int, int]:
        return self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size, 0

    def tensor_parallel_split(self) -> tuple[tuple[int, int | None], dict[str, int]]:
        # MoE blocks are replicated under tp; the dense blocks' MLP is split when there are any.
        sizes = {"vocab_size": self.vocab_size}
        if not all(self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            sizes["intermediate_size"] = self.intermediate_size
        return (self.num_attention_heads, self.num_key_value_heads), sizes

    def balance_loss_key(self) -> str | None:
        return "output_router_logits" if self.output_router_logits else None


def check_sparse_moe(args, default_experts: int) -> None:
    """The sparse-MoE keys Qwen3-MoE and Qwen2-MoE share (num_experts / num_local_experts,
    num_experts_per_tok, moe_intermediate_size, decoder_sparse_step, mlp_only_layers,
    router_aux_loss_coef), validated in place."""
    args._positive("moe_intermediate_size", "num_experts_per_tok", "decoder_sparse_step")
    if args.num_experts is not None and args.num_local_experts is not None \
            and args.num_experts != args.num_local_experts:
        raise ModelConfigError(f"model.num_local_experts: {args.num_local_experts} contradicts "
                               f"num_experts={args.num_experts} (one name for the same count)")
    experts = next((v for v in (args.num_experts, args.num_local_experts) if v is not None), default_experts)
    if experts < 0:
        raise ModelConfigError(f"model.num_experts: must be >= 0, got {experts}")
    args.num_experts = args.num_local_experts = experts
    if experts and args.num_experts_per_tok > experts:
        raise ModelConfigError(f"model.num_experts_per_tok: {args.num_experts_per_tok} exceeds num_experts={experts}")
    args.mlp_only_layers = list(args.mlp_only_layers or [])
    for i in args.mlp_only_layers:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < args.num_hidden_layers:
            raise ModelConfigError(f"model.mlp_only_layers: {i!r} is not a layer index in [0, {args.num_hidden_layers})")
    if args.router_aux_loss_coef < 0:
        raise ModelConfigError(f"model.router_aux_loss_coef: must be >= 0, got {args.router_aux_loss_coef!r}")
