"""GLM-4: Llama's block with a norm after the attention and one after the MLP, and RoPE over the
first half (partial_rotary_factor) of each head, in GLM's interleaved pairs.

    h   = x + attention_post_norm(attention(attention_norm(x)))
    out = h + ffn_post_norm(feed_forward(ffn_norm(h)))

Parameters: Llama's names plus layers.{i}.attention_post_norm / ffn_post_norm [H]; q/k/v biases
when attention_bias.
"""

from __future__ import annotations

import mindspore as ms

from ..common.layers import RMSNorm
from ..common.rope import apply_partial_rotary
from ..llama.model import Attention, GQACausalLM, TransformerBlock
from .args import Glm4Args


class Glm4Attention(Attention):
    """GQA attention rotating the first `rotary_dim` features of each head, pairs interleaved."""

    interleaved = True

    def __init__(self, args, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type):
        super().__init__(args, layer_id, compute_dtype, params_dtype)
        self.rotary_dim = args.rotary_dim

    def rotate(self, x, cos, sin):
        return apply_partial_rotary(x, cos, sin, self.rotary_dim, self.interleaved)


class Glm4Block(TransformerBlock):
    """Llama's pre-norm block with the attention's and the MLP's outputs normalised too."""

    def __init__(self, args: Glm4Args, layer_id: int, compute_dtype: ms.Type, params_dtype: ms.Type):
        super().__init__(args, layer_id, compute_dtype, params_dtype, Glm4Attention)
        self.attention_post_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, params_dtype)
        self.ffn_post_norm = RMSNorm(args.hidden_size, args.rms_norm_eps, params_dtype)

    def construct(self, x, cos, sin, mask, cache=None):
        h = x + self.attention_post_norm(self.attention(self.attention_norm(x), cos, sin, mask, cache))
        return h + self.ffn_post_norm(self.feed_forward(self.ffn_norm(h)))


class Glm4ForCausalLM(GQACausalLM):
    def __init__(self, args: Glm4Args):
        super().__init__(args, args.rotary_dim, lambda i, cdt, pdt: Glm4Block(args, i, cdt, pdt))
