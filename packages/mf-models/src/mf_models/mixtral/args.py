"""Mixtral hyper-parameters (HF `MixtralConfig` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.args import BaseArgs, default_head_dim
from ..errors import ModelConfigError


@dataclass
class MixtralArgs(BaseArgs):
    """Llama's attention (no biases) and, in every layer, `num_local_experts` SwiGLU experts of
    `intermediate_size`, `num_experts_per_tok` chosen per token by a softmax router and weighted by
    their renormalised probabilities; no shared expert.

    `output_router_logits: true` trains with transformers' load-balancing loss weighted by
    `router_aux_loss_coef` (see common/balancing.py; `forward_train`); false (HF's default) trains
    without it, as HF does. Refused: `sliding_window` (sliding-window attention is not
    implemented) and `router_jitter_noise` > 0 (HF's multiplicative training noise on the router
    input is not implemented).
    """

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    sliding_window: int | None = None
    router_jitter_noise: float = 0.0
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001

    def validate(self) -> None:
        super().validate()
        self._positive("num_local_experts", "num_experts_per_tok")
        default_head_dim(self)
        self.qkv_bias = self.o_bias = False
        if self.num_experts_per_tok > self.num_local_experts:
            raise ModelConfigError(f"model.num_experts_per_tok: {self.num_experts_per_tok} exceeds "
                                   f"num_local_experts={self.num_local_experts}")
        if self.sliding_window is not None:
            raise ModelConfigError(f"model.sliding_window: sliding-window attention is not implemented; "
                                   f"must be null, got {self.sliding_window!r}")
        if self.router_jitter_noise != 0:
            raise ModelConfigError(f"model.router_jitter_noise: router input jitter is not implemented; "
                                   f"must be 0.0, got {self.router_jitter_noise!r}")
        if self.router_aux_loss_coef < 0:
            raise ModelConfigError(f"model.router_aux_loss_coef: must be >= 0, got {self.router_aux_loss_coef!r}")

    def tensor_parallel_split(self) -> tuple[tuple[int, int | None], dict[str, int]]:
        # Every layer is MoE, and MoE blocks are replicated under tp: heads and vocabulary split.
        return (self.num_attention_heads, self.num_key_value_heads), {"vocab_size": self.vocab_size}

    def balance_loss_key(self) -> str | None:
        return "output_router_logits" if self.output_router_logits else None

    def is_moe_layer(self, i: int) -> bool:
        return 0 <= i < self.num_hidden_layers

    def moe_sizes(self) -> tuple[int, int, int, int]:
        return self.num_local_experts, self.num_experts_per_tok, self.intermediate_size, 0
