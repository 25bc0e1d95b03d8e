"""Llama hyper-parameters (HF `LlamaConfig` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.args import BaseArgs
from ..errors import ModelConfigError


@dataclass
class LlamaArgs(BaseArgs):
    """GQA attention with RoPE, SwiGLU MLP, RMSNorm; `head_dim` defaults to hidden_size / heads.

    attention_bias: biases on wq/wk/wv/wo; mlp_bias: biases on w1/w2/w3.
    """

    attention_bias: bool = False
    mlp_bias: bool = False

    def validate(self) -> None:
        super().validate()
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ModelConfigError(
                    f"model.hidden_size: {self.hidden_size} is not divisible by num_attention_heads="
                    f"{self.num_attention_heads}; set head_dim explicitly")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2:
            raise ModelConfigError(f"model.head_dim: rotary embedding needs an even head_dim, got {self.head_dim}")
