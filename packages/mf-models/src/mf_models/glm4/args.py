"""GLM-4 hyper-parameters (HF `Glm4Config` names; defaults are HF's)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelConfigError
from ..llama.args import LlamaArgs


@dataclass
class Glm4Args(LlamaArgs):
    """GLM-4-0414 (Glm4ForCausalLM): Llama's GQA attention with q/k/v biases (`attention_bias`,
    HF's default true; o_proj never biased), RoPE over the first `partial_rotary_factor` of each
    head (0.5 unless `rope_parameters` or the legacy top-level key says otherwise) with GLM's
    interleaved pairs, RMSNorms after the attention and after the MLP besides the usual two, and a
    SwiGLU MLP (HF packs gate and up in one `gate_up_proj`; mf-ckpt unpacks it).

    `head_dim` defaults to 128 as in HF. HF's Glm4Config fills `eos_token_id` with GLM-4's three
    stop tokens and `pad_token_id` 151329 when they are absent; config.json files carry them, and
    here absent means none (a YAML model of another vocabulary would not have those ids).
    """

    partial_rotary_default = 0.5

    vocab_size: int = 151552
    hidden_size: int = 4096
    intermediate_size: int = 13696
    num_hidden_layers: int = 40
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 2
    head_dim: int | None = 128
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1.5625e-07
    attention_bias: bool = True
    partial_rotary_factor: float | None = None

    def validate(self) -> None:
        super().validate()
        if self.mlp_bias:
            raise ModelConfigError("model.mlp_bias: GLM-4's MLP has no biases; remove the key")
        self.qkv_bias, self.o_bias = self.attention_bias, False
        set_rotary_dim(self)


def set_rotary_dim(args) -> None:
    """`args.rotary_dim`: the features of each head RoPE rotates (HF: int(head_dim * factor))."""
    args.rotary_dim = int(args.head_dim * args.rope["partial_rotary_factor"])
    if args.rotary_dim % 2 or args.rotary_dim == 0:
        raise ModelConfigError(f"model.partial_rotary_factor: rotating {args.rotary_dim} of head_dim={args.head_dim} "
                               f"features; the rotated part must be even and non-empty")
