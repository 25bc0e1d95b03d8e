"""Llama hyper-parameters (HF `LlamaConfig` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..common.args import BaseArgs, default_head_dim


@dataclass
class LlamaArgs(BaseArgs):
    """GQA attention with RoPE, SwiGLU MLP, RMSNorm; `head_dim` defaults to hidden_size / heads.

    attention_bias: biases on wq/wk/wv/wo; mlp_bias: biases on w1/w2/w3. The attention reads the
    derived `qkv_bias` / `o_bias` (Qwen2 biases wq/wk/wv but not wo).
    """

    attention_bias: bool = False
    mlp_bias: bool = False

    def validate(self) -> None:
        super().validate()
        default_head_dim(self)
        self.qkv_bias = self.o_bias = self.attention_bias
