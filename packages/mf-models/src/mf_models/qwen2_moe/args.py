"""Qwen2-MoE hyper-parameters (HF `Qwen2MoeConfig` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.args import check_full_attention
from ..errors import ModelConfigError
from ..llama.args import LlamaArgs
from ..qwen3_moe.args import check_sparse_moe


@dataclass
class Qwen2MoeArgs(LlamaArgs):
    """Qwen2's attention (q/k/v biased when `qkv_bias`, HF's default true; o_proj and the MLPs
    never) and, in layer i, a routed MoE when i is not in `mlp_only_layers` and (i + 1) %
    `decoder_sparse_step` == 0, else a dense MLP of `intermediate_size`: `num_experts` experts of
    `moe_intermediate_size`, `num_experts_per_tok` chosen by softmax probability, renormalised
    only with `norm_topk_prob`, plus one shared expert of `shared_expert_intermediate_size` whose
    output is scaled per token by sigmoid(`shared_expert_gate`(x)).

    As Qwen3-MoE: `num_experts` is also read as `num_local_experts`, `output_router_logits: true`
    trains with transformers' load-balancing loss weighted by `router_aux_loss_coef`.
    Sliding-window attention is refused as for Qwen2 (a layer HF would run with a window:
    `layer_types` "sliding_attention", or HF's Qwen2-MoE rule: use_sliding_window, an odd layer
    number i + 1 and i < max_window_layers).
    """

    vocab_size: int = 151936
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int | None = 16
    max_position_embeddings: int = 32768
    qkv_bias: bool = True
    moe_intermediate_size: int = 1408
    shared_expert_intermediate_size: int = 5632
    num_experts_per_tok: int = 4
    num_experts: int | None = None
    num_local_experts: int | None = None
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list | None = None
    output_router_logits: bool = False
    router_aux_loss_coef: float = 0.001
    use_sliding_window: bool = False
    sliding_window: int | None = 4096
    max_window_layers: int = 28
    layer_types: list | None = None

    def validate(self) -> None:
        qkv_bias = self.qkv_bias          # the config key; LlamaArgs derives its own from attention_bias
        super().validate()
        for name in ("attention_bias", "mlp_bias"):
            if getattr(self, name):
                raise ModelConfigError(f"model.{name}: Qwen2-MoE's biases are q/k/v's (qkv_bias); remove the key")
        self.qkv_bias, self.o_bias = qkv_bias, False
        check_sparse_moe(self, 60)
        if self.shared_expert_intermediate_size < 0:
            raise ModelConfigError(f"model.shared_expert_intermediate_size: must be >= 0, got "
                                   f"{self.shared_expert_intermediate_size}")
        check_full_attention(self, [self.use_sliding_window and (i + 1) % 2 == 1 and i < self.max_window_layers
                                    for i in range(self.num_hidden_layers)])

    def is_moe_layer(self, i: int) -> bool:
        """HF's rule (Qwen2MoeDecoderLayer)."""
        return i not in self.mlp_only_layers and self.num_experts > 0 and (i + 1) % self.decoder_sparse_step == 0

    def moe_sizes(self) -> tuple[int, int, int, int]:
        return self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size, \
            self.shared_expert_intermediate_size

    def tensor_parallel_split(self) -> tuple[tuple[int, int | None], dict[str, int]]:
        # MoE blocks (shared expert included) are replicated under tp; dense blocks' MLP is split.
        sizes = {"vocab_size": self.vocab_size}
        if not all(self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            sizes["intermediate_size"] = self.intermediate_size
        return (self.num_attention_heads, self.num_key_value_heads), sizes

    def balance_loss_key(self) -> str | None:
        return "output_router_logits" if self.output_router_logits else None
